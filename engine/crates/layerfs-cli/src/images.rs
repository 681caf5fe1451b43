//! The image commands: `pull`, `push`, `login`, `image ls`, `image rm`,
//! and the registry options `create --from REF` shares with them.

use std::io::{self, Write};

use layerfs_daemon::protocol::{ImageInfo, PushInfo, RegistryOptions, Request};

use crate::workspaces::{human, Client};

/// How to reach a registry.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct RegistryArgs {
    /// The platform to pull from a multi-platform image, `os/arch[/variant]`
    /// (e.g. linux/arm64) [default: the host's]
    #[arg(long, value_name = "OS/ARCH")]
    platform: Option<String>,
    /// Reach this registry (`host[:port]`) over plain HTTP; repeat for more.
    #[arg(long, value_name = "HOST")]
    insecure_registry: Vec<String>,
    /// Check the registry's TLS certificate. Extra certificate authorities
    /// come from a PEM file named by LAYERFS_REGISTRY_CA in the daemon's
    /// environment.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    tls_verify: bool,
}

impl From<RegistryArgs> for RegistryOptions {
    fn from(args: RegistryArgs) -> RegistryOptions {
        RegistryOptions {
            platform: args.platform,
            insecure: args.insecure_registry,
            no_tls_verify: !args.tls_verify,
            ..RegistryOptions::default()
        }
    }
}

/// Lazy pull: a layer whose blob carries a table of contents (eStargz,
/// zstd:chunked) is ready from the table alone; its files' data comes at
/// first read, and the daemon fetches the rest in the background.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LazyArgs {
    /// Download every layer whole before answering, as for an image with
    /// no table of contents.
    #[arg(long, conflicts_with_all = ["complete", "on_read"])]
    whole: bool,
    /// Pull lazily, then wait until every layer's data is here.
    #[arg(long, conflicts_with = "on_read")]
    complete: bool,
    /// Bring lazy layers' data only as it is read: the daemon does not
    /// fetch the rest in the background (until a pull without this).
    #[arg(long)]
    on_read: bool,
}

impl RegistryArgs {
    /// The options of a pull, lazy as `lazy` says.
    pub fn pulling(self, lazy: LazyArgs) -> RegistryOptions {
        RegistryOptions {
            whole: lazy.whole,
            complete: lazy.complete,
            on_read: lazy.on_read,
            ..self.into()
        }
    }
}

#[derive(clap::Args)]
pub struct PullArgs {
    /// `[registry/]repository[:tag|@sha256:...]`; Docker Hub's defaults
    /// apply (`debian` is docker.io/library/debian:latest).
    reference: String,
    #[command(flatten)]
    registry: RegistryArgs,
    #[command(flatten)]
    lazy: LazyArgs,
}

#[derive(clap::Args)]
pub struct PushArgs {
    /// Workspaces (with no changes of their own: commit first) and layers,
    /// bottom first, then the image reference to push them as.
    #[arg(required = true, num_args = 2.., value_name = "WORKSPACE|LAYER... REF")]
    sources: Vec<String>,
    #[command(flatten)]
    registry: RegistryArgs,
    /// How layers the registry lacks are written: gzip; estargz (a gzip tar
    /// with a table of contents, which layerfs, stargz-snapshotter and
    /// others pull lazily; any tool unpacks it); or zstd:chunked (a zstd tar
    /// with a table of contents, which layerfs pulls lazily; podman reads
    /// it, whole, as it carries no tar-split data).
    #[arg(long, value_name = "FORMAT", value_parser = ["gzip", "estargz", "zstd:chunked"], default_value = "gzip")]
    format: String,
}

#[derive(clap::Args)]
pub struct LoginArgs {
    /// The registry, `host[:port]` (docker.io for Docker Hub).
    registry: String,
    /// The user name [default: asked for]
    #[arg(long, short)]
    username: Option<String>,
    /// Read the password from standard input (one line) instead of asking.
    #[arg(long)]
    password_stdin: bool,
}

#[derive(clap::Subcommand)]
pub enum ImageCommand {
    /// List the images pulled: reference, digest, layers, size.
    Ls,
    /// Forget an image; its layers stay while workspaces use them
    /// (`layerfs layer rm` removes one nobody uses).
    Rm {
        /// The reference it was pulled by.
        reference: String,
    },
    /// Forget every image no workspace is made from, and remove the layers
    /// only those images listed.
    Prune,
}

/// Stores credentials for a registry in podman's auth file, where pulls
/// (and podman) read them. They are checked at the next pull, not here.
pub fn login(args: LoginArgs) -> Result<(), String> {
    let read_line = |prompt: &str| -> Result<String, String> {
        eprint!("{prompt}");
        let mut line = String::new();
        io::stdin()
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        Ok(line.trim_end_matches(['\n', '\r']).to_owned())
    };
    let user = match args.username {
        Some(user) => user,
        None if args.password_stdin => return Err("give --username with --password-stdin".into()),
        None => read_line("Username: ")?,
    };
    let password = if args.password_stdin {
        read_line("")?
    } else {
        rpassword::prompt_password("Password: ")
            .map_err(|e| format!("cannot read the password: {e}"))?
    };
    if user.is_empty() || password.is_empty() {
        return Err("a user name and a password are needed".into());
    }
    let file = layerfs_registry::store_credentials(&args.registry, &user, &password)
        .map_err(|e| e.message)?;
    println!(
        "credentials for {} stored in {}",
        args.registry,
        file.display()
    );
    Ok(())
}

/// The share of lazy layers' file data here, as `image ls` and `ls` show
/// it: what is not lazy is all here.
pub fn local_share(local: Option<(u64, u64)>) -> String {
    match local {
        Some((here, all)) if all > 0 => format!("{}%", here * 100 / all),
        _ => "100%".into(),
    }
}

/// What a pull made lazily, and what it could not: on stderr, so the
/// line a script reads on stdout stays one.
fn say_lazy(image: &ImageInfo) {
    say_whole(&image.whole);
    if let Some((local, all)) = image.local {
        if local < all {
            eprintln!(
                "lazy: {} of {} of file data here; the rest comes as it is read",
                human(local),
                human(all)
            );
        }
    }
}

/// The blobs a pull downloaded whole, having no table of contents: never
/// a silent fallback from a lazy pull.
pub fn say_whole(blobs: &[String]) {
    if !blobs.is_empty() {
        eprintln!(
            "downloaded whole, with no table of contents to pull lazily: {}",
            blobs.join(", ")
        );
    }
}

impl Client {
    pub fn pull(&self, args: PullArgs) -> Result<(), String> {
        let request = Request::Pull {
            reference: args.reference,
            registry: args.registry.pulling(args.lazy),
        };
        if let Some(image) = self.call::<ImageInfo>(request)? {
            println!(
                "{} {} ({} layers, {} downloaded)",
                image.reference,
                image.digest,
                image.layers.len(),
                image.fetched
            );
            say_lazy(&image);
        }
        Ok(())
    }

    pub fn push(&self, mut args: PushArgs) -> Result<(), String> {
        let reference = args.sources.pop().expect("clap asks for two or more");
        let request = Request::Push {
            sources: args.sources,
            reference,
            registry: args.registry.into(),
            format: Some(args.format),
        };
        if let Some(pushed) = self.call::<PushInfo>(request)? {
            println!(
                "{} {} ({} layers, {} uploaded)",
                pushed.reference, pushed.digest, pushed.layers, pushed.uploaded
            );
        }
        Ok(())
    }

    pub fn image(&self, command: ImageCommand) -> Result<(), String> {
        match command {
            ImageCommand::Ls => {
                if let Some(images) = self.call::<Vec<ImageInfo>>(Request::ImageLs)? {
                    let mut out = io::stdout().lock();
                    let _ = writeln!(
                        out,
                        "{:<50} {:<19} {:>6} {:>8} {:>6}",
                        "REFERENCE", "DIGEST", "LAYERS", "SIZE", "LOCAL"
                    );
                    for i in images {
                        let digest = i.digest.strip_prefix("sha256:").unwrap_or(&i.digest);
                        let local = local_share(i.local);
                        let _ = writeln!(
                            out,
                            "{:<50} {:<19} {:>6} {:>8} {:>6}",
                            i.reference,
                            format!("sha256:{}", &digest[..digest.len().min(12)]),
                            i.layers.len(),
                            human(i.size),
                            local
                        );
                    }
                }
            }
            ImageCommand::Prune => self.prune(Request::ImagePrune)?,
            ImageCommand::Rm { reference } => {
                if let Some(full) = self.call::<String>(Request::ImageRm { reference })? {
                    println!("removed image {full}");
                }
            }
        }
        Ok(())
    }
}
