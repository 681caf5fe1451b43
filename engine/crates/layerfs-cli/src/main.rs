//! `layerfs`: serve a directory to the kernel over loopback NFSv3.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use layerfs_rpc::{Dispatcher, Server, ServerConfig};
use layerfs_vfs::LocalFs;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "layerfs",
    version,
    about = "A layered, writable workspace served to the kernel over loopback NFSv3"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve DIR over NFSv3 in the foreground until interrupted (SIGINT or SIGTERM).
    ///
    /// The first line printed is `listening on ADDR:PORT`; the lines after it
    /// show how to mount the export from Linux and macOS. Logs go to stderr;
    /// set RUST_LOG (e.g. RUST_LOG=debug or RUST_LOG=layerfs_rpc=trace) to see more.
    Serve(ServeArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Address to listen on. Port 0 lets the OS pick a free port. Serve on
    /// loopback only: NFSv3 with AUTH_SYS trusts whatever uid a client claims.
    #[arg(long, default_value = "127.0.0.1:0", value_name = "ADDR")]
    listen: SocketAddr,
    /// Calls in flight per connection before the server stops reading more from it.
    #[arg(long, default_value_t = ServerConfig::default().window, value_name = "N")]
    window: usize,
    /// Threads that run calls, shared by all connections.
    #[arg(long, default_value_t = ServerConfig::default().workers, value_name = "N")]
    workers: usize,
    /// The directory to export.
    dir: PathBuf,
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
    let result = match cli.command {
        Command::Serve(args) => serve(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("layerfs: {message}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs) -> Result<(), String> {
    let dir = args
        .dir
        .canonicalize()
        .map_err(|e| format!("cannot export {}: {e}", args.dir.display()))?;
    if !dir.is_dir() {
        return Err(format!("cannot export {}: not a directory", dir.display()));
    }
    let fs = LocalFs::open(&dir).map_err(|e| format!("cannot export {}: {e}", dir.display()))?;
    let host_path = dir.as_os_str().as_encoded_bytes();
    let programs = layerfs_nfs::programs(Arc::new(fs), host_path)
        .map_err(|e| format!("cannot export {}: {e}", dir.display()))?;
    let config = ServerConfig {
        window: args.window,
        workers: args.workers,
    };
    let server = Server::bind(args.listen, Arc::new(Dispatcher::new(programs)), config)
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = server.local_addr().map_err(|e| e.to_string())?;
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = stop_tx.send(());
    })
    .map_err(|e| format!("cannot install the signal handler: {e}"))?;
    let _handle = server
        .spawn()
        .map_err(|e| format!("cannot start the server: {e}"))?;

    let port = addr.port();
    let ip = addr.ip();
    let mut out = std::io::stdout().lock();
    let banner = format!(
        "listening on {addr}\n\
         exporting {dir} as /\n\
         mount it from Linux (as root):\n  \
         mount -t nfs -o vers=3,proto=tcp,port={port},mountport={port},mountproto=tcp,nolock,addr={ip} {ip}:/ /mnt/layerfs\n\
         mount it from macOS:\n  \
         mount -t nfs -o vers=3,tcp,port={port},mountport={port},locallocks,noresvport {ip}:/ ~/layerfs\n\
         stop with Ctrl-C\n",
        dir = dir.display(),
    );
    out.write_all(banner.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))?;
    drop(out);
    let _ = stop_rx.recv();
    tracing::info!("stopping");
    Ok(())
}
