//! `layerfs`: layered, writable workspaces served to the kernel over
//! loopback NFSv3 or FUSE.
#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

mod demo;
mod images;
mod serve;
mod shell;
mod space;
mod workspaces;

#[derive(Parser)]
#[command(
    name = "layerfs",
    version,
    about = "Layered, writable workspaces served to the kernel over loopback NFSv3 or FUSE",
    long_about = "Layered, writable workspaces served to the kernel over loopback NFSv3 or FUSE.\n\n\
        Start `layerfs daemon`, import layers (`layerfs layer import`), make a workspace on them \
        (`layerfs create`), mount it (`layerfs mount`), and commit its changes as a new layer \
        (`layerfs commit`). `layerfs serve` serves one directory or stack without a daemon."
)]
struct Cli {
    /// The store of layers and workspaces [default: the user's data
    /// directory, e.g. ~/.local/share/layerfs]
    #[arg(long, global = true, env = "LAYERFS_STORE", value_name = "DIR")]
    store: Option<PathBuf>,
    /// Print the daemon's answer as JSON on stdout (for scripts).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the workspace daemon for the store in the foreground (until
    /// SIGINT or SIGTERM, which unmount every workspace it mounted). It
    /// serves every workspace mounted over NFS from one server on a
    /// 127.0.0.1 port kept in the store, and mounts again after a crash what
    /// was mounted. The first line printed says it is ready. Logs go to
    /// stderr (RUST_LOG=debug for more).
    Daemon(workspaces::DaemonArgs),
    /// Try layerfs: a daemon on a throwaway store with two small generated
    /// layers, and a workspace over them mounted (through FUSE on Linux
    /// without a kernel NFS client, else NFS); prints what to try. Ctrl-C
    /// unmounts and removes it all.
    Demo(demo::DemoArgs),
    /// Layers: import, list, remove.
    #[command(subcommand)]
    Layer(workspaces::LayerCommand),
    /// Pull an image from its registry into the store: only the layers the
    /// store lacks are downloaded, three at once, each checked against its
    /// digests before it is kept. Credentials come from podman's and
    /// Docker's auth files.
    Pull(images::PullArgs),
    /// Push workspaces' layers (commit first) and layers as an image: only
    /// blobs the registry lacks are uploaded; a layer pulled from it, or
    /// pushed before, uploads nothing.
    Push(images::PushArgs),
    /// Store credentials for a registry in podman's auth file
    /// ($REGISTRY_AUTH_FILE, or $XDG_RUNTIME_DIR/containers/auth.json, mode
    /// 0600), where `pull` reads them (and Docker's config.json too).
    Login(images::LoginArgs),
    /// Images pulled: list, remove.
    #[command(subcommand)]
    Image(images::ImageCommand),
    /// Make a workspace: an empty writable layer over the layers given.
    Create(workspaces::CreateArgs),
    /// Mount a workspace on an empty directory.
    Mount(workspaces::MountArgs),
    /// Unmount a workspace (by name or mount point), lazily if busy.
    Unmount(workspaces::UnmountArgs),
    /// Turn a workspace's changes into a new layer; the workspace goes on
    /// over it with no changes of its own, files and handles unchanged.
    Commit(workspaces::CommitArgs),
    /// What a workspace changed over its layers, one path per line, sorted:
    /// `A` added, `C` changed (with what: type, data, mode, owner, times),
    /// `D` deleted. Mounted or not; taken at one moment.
    Diff(workspaces::DiffArgs),
    /// Throw away a workspace's changes: all of them, or those under the
    /// paths given (from the workspace's root). Mounted or not; every
    /// process sees the layers' contents at once.
    Reset(workspaces::ResetArgs),
    /// Change a workspace's settings: its size limit (`--size`).
    Set(workspaces::SetArgs),
    /// List the workspaces, where each is mounted, and any problem.
    Ls,
    /// Remove a workspace and its changes.
    Rm(workspaces::RmArgs),
    /// The store as a whole: `system df`, the space it takes.
    #[command(subcommand)]
    System(space::SystemCommand),
    /// The NFS server's counters: calls per procedure, reads per record,
    /// writes per reply, bytes, connections.
    Stats,
    /// Serve DIR, or a stack of --layer directories under an --upper one, in
    /// the foreground until interrupted (SIGINT or SIGTERM), without a
    /// daemon: over NFSv3 (the default, or --listen), or mounted through
    /// FUSE (--fuse, Linux).
    ///
    /// Over NFS the first line printed is `listening on ADDR:PORT`; the lines
    /// after it show how to mount the export from Linux and macOS. With
    /// --fuse the first line is `mounted on PATH`, and an interrupt
    /// unmounts. Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=debug or
    /// RUST_LOG=layerfs_rpc=trace) to see more.
    Serve(serve::ServeArgs),
    /// Print the shell completion script for bash, zsh or fish. For bash:
    /// `layerfs completions bash > ~/.local/share/bash-completion/completions/layerfs`.
    Completions(shell::CompletionsArgs),
    /// Write the man pages (`layerfs.1`, `layerfs-create.1`, ...) into a
    /// directory, e.g. `layerfs man ~/.local/share/man/man1`.
    Man(shell::ManArgs),
    /// Holds the FUSE mounts' descriptors of the store's daemon, so they
    /// outlive it; the daemon starts it.
    #[command(hide = true)]
    Keeper,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    let client = workspaces::Client {
        store: cli.store,
        json: cli.json,
    };
    let result = match cli.command {
        Command::Serve(args) if args.fuse.is_some() => serve::serve_fuse(args),
        Command::Serve(args) => serve::serve(args),
        Command::Daemon(args) => workspaces::daemon(client, args),
        Command::Demo(args) => demo::demo(args),
        Command::Layer(command) => client.layer(command),
        Command::Create(args) => client.create(args),
        Command::Pull(args) => client.pull(args),
        Command::Login(args) => images::login(args),
        Command::Push(args) => client.push(args),
        Command::Image(command) => client.image(command),
        Command::Mount(args) => client.mount(args),
        Command::Unmount(args) => client.unmount(args),
        Command::Commit(args) => client.commit(args),
        Command::Diff(args) => client.diff(args),
        Command::Reset(args) => client.reset(args),
        Command::Set(args) => client.set(args),
        Command::Ls => client.ls(),
        Command::Rm(args) => client.rm(args),
        Command::Stats => client.stats(),
        Command::System(command) => client.system(command),
        Command::Completions(args) => shell::completions(args),
        Command::Man(args) => shell::man(args),
        Command::Keeper => workspaces::keeper(client),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("layerfs: {message}");
            ExitCode::FAILURE
        }
    }
}

/// A channel that receives once SIGINT or SIGTERM arrives.
fn interrupted() -> Result<std::sync::mpsc::Receiver<()>, String> {
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = stop_tx.send(());
    })
    .map_err(|e| format!("cannot install the signal handler: {e}"))?;
    Ok(stop_rx)
}
