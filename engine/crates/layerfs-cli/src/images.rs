//! The image commands: `pull`, `image ls`, `image rm`, and the registry
//! options `create --from REF` shares with `pull`.

use std::io::{self, Write};

use layerfs_daemon::protocol::{ImageInfo, RegistryOptions, Request};

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
}

impl Client {
    pub fn pull(&self, args: PullArgs) -> Result<(), String> {
        let request = Request::Pull {
            reference: args.reference,
            registry: args.registry.into(),
        };
        if let Some(image) = self.call::<ImageInfo>(request)? {
            println!(
                "{} {} ({} layers, {} downloaded)",
                image.reference,
                image.digest,
                image.layers.len(),
                image.fetched
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
                        "{:<50} {:<19} {:>6} {:>8}",
                        "REFERENCE", "DIGEST", "LAYERS", "SIZE"
                    );
                    for i in images {
                        let digest = i.digest.strip_prefix("sha256:").unwrap_or(&i.digest);
                        let _ = writeln!(
                            out,
                            "{:<50} {:<19} {:>6} {:>8}",
                            i.reference,
                            format!("sha256:{}", &digest[..digest.len().min(12)]),
                            i.layers.len(),
                            human(i.size)
                        );
                    }
                }
            }
            ImageCommand::Rm { reference } => {
                if let Some(full) = self.call::<String>(Request::ImageRm { reference })? {
                    println!("removed image {full}");
                }
            }
        }
        Ok(())
    }
}
