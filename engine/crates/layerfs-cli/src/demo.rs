//! `layerfs demo`: a daemon on a throwaway store with two small generated
//! layers, one workspace mounted over them, and what to try; Ctrl-C
//! unmounts and removes it all.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use layerfs_daemon::protocol::{ControlError, Request, Response};

use crate::interrupted;
use crate::workspaces::daemon_server_config;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Where to mount the workspace (an empty directory) [default: a new
    /// directory next to the demo store]
    #[arg(value_name = "PATH")]
    mountpoint: Option<PathBuf>,
}

pub fn demo(args: DemoArgs) -> Result<(), String> {
    let base = std::env::temp_dir().join(format!("layerfs-demo-{}", std::process::id()));
    std::fs::create_dir(&base).map_err(|e| format!("cannot make {}: {e}", base.display()))?;
    // Readable by all, so a FUSE or NFS mount below it can be reached.
    let _ = std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755));
    let result = run(&base, args);
    if let Err(e) = layerfs_layers::remove_tree(&base) {
        eprintln!("layerfs: cannot remove {}: {e}", base.display());
    }
    result
}

fn run(base: &Path, args: DemoArgs) -> Result<(), String> {
    let store = base.join("store");
    let mountpoint = match args.mountpoint {
        Some(path) => path,
        None => {
            let path = base.join("workspace");
            std::fs::create_dir(&path).map_err(|e| e.to_string())?;
            path
        }
    };
    let mountpoint = mountpoint
        .canonicalize()
        .map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let (base_layer, tools_layer) = (base.join("layer-base"), base.join("layer-tools"));
    generate_layers(&base_layer, &tools_layer)
        .map_err(|e| format!("cannot make the layers: {e}"))?;

    let stop = interrupted()?;
    let config = layerfs_daemon::DaemonConfig {
        store: store.clone(),
        nfs_port: None,
        server: daemon_server_config(),
        // The demo's mount lasts as long as the demo.
        keeper: None,
        lock_wait: std::time::Duration::ZERO,
        fuse_io_uring: false,
    };
    let daemon = std::thread::spawn(move || layerfs_daemon::run(config, stop));
    std::fs::create_dir_all(&store).map_err(|e| e.to_string())?;
    let socket =
        layerfs_daemon::paths::control_socket(&store.canonicalize().map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    let ask = |request: Request| -> Result<Response, String> {
        let reply = layerfs_daemon::control::call(&socket, &request).map_err(|e| e.to_string())?;
        Result::<Response, ControlError>::from(reply).map_err(|e| e.message)
    };
    let unexpected = |r: Response| format!("the daemon answered {r:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while ask(Request::Ls).is_err() {
        if daemon.is_finished() {
            return daemon
                .join()
                .map_err(|_| "the daemon panicked".to_string())?
                .map_err(|e| e.message);
        }
        if Instant::now() > deadline {
            return Err("the daemon did not start within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut ids = Vec::new();
    for layer in [&base_layer, &tools_layer] {
        match ask(Request::LayerImport {
            source: layer.clone(),
        })? {
            Response::Layer(layer) => ids.push(layer.id),
            other => return Err(unexpected(other)),
        }
    }
    let door = match ask(Request::Create {
        name: "demo".into(),
        from: ids,
        size: None,
        registry: Default::default(),
        mount: Some(mountpoint.clone()),
        door: None,
    })? {
        Response::Workspace(w) => w.mount.map(|m| m.door.to_string()),
        other => return Err(unexpected(other)),
    }
    .unwrap_or_else(|| "?".into());
    let (m, s) = (mountpoint.display(), store.display());
    let l = command_name();
    // Written, not println!: a reader of stdout that is gone (a pipe whose
    // reader exited) must not end the demo before its cleanup, which
    // Ctrl-C still runs.
    let _ = writeln!(
        std::io::stdout(),
        "\nworkspace \"demo\" is mounted on {m} ({door}), over two layers:\n  \
         base: README, etc/os-release, docs/guide.txt, docs/old-notes.txt\n  \
         tools: bin/hello, and a whiteout that hides docs/old-notes.txt\n\n\
         try, in another terminal:\n  \
         ls -la {m} {m}/docs\n  \
         cat {m}/README; {m}/bin/hello\n  \
         echo mine > {m}/notes.txt; rm {m}/docs/guide.txt\n  \
         {l} --store {s} diff demo\n  \
         {l} --store {s} commit demo --message 'my changes'\n  \
         {l} --store {s} layer ls\n  \
         {l} --store {s} create second --from demo\n  \
         {l} --store {s} ls\n\n\
         Ctrl-C unmounts everything and removes the demo store.\n"
    );
    daemon
        .join()
        .map_err(|_| "the daemon panicked".to_string())?
        .map_err(|e| e.message)
}

/// How the user runs this binary from a shell: `layerfs` where that name
/// on PATH is this binary, else its full path (`cargo run` leaves it in
/// target/, which is on no PATH).
fn command_name() -> String {
    let me = std::env::current_exe().and_then(|p| p.canonicalize());
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("layerfs"))
            .find(|p| p.is_file())
    });
    match (me, on_path) {
        (Ok(me), Some(found)) if found.canonicalize().is_ok_and(|f| f == me) => "layerfs".into(),
        (Ok(me), _) => me.display().to_string(),
        (Err(_), _) => "layerfs".into(),
    }
}

/// Two small layers: a base, and a layer of tools over it that also hides a
/// file of the base (an OCI whiteout).
fn generate_layers(base: &Path, tools: &Path) -> std::io::Result<()> {
    for dir in ["etc", "docs"] {
        std::fs::create_dir_all(base.join(dir))?;
    }
    std::fs::write(
        base.join("README"),
        "This workspace is two read-only layers under a writable one.\n\
         Whatever you change lands in the writable layer; `layerfs commit`\n\
         turns it into a new layer.\n",
    )?;
    std::fs::write(
        base.join("etc/os-release"),
        "NAME=\"layerfs demo\"\nID=demo\n",
    )?;
    std::fs::write(base.join("docs/guide.txt"), "The base layer's guide.\n")?;
    std::fs::write(
        base.join("docs/old-notes.txt"),
        "Hidden by the tools layer.\n",
    )?;
    std::fs::create_dir_all(tools.join("bin"))?;
    std::fs::create_dir_all(tools.join("docs"))?;
    let hello = tools.join("bin/hello");
    std::fs::write(&hello, "#!/bin/sh\necho \"hello from the tools layer\"\n")?;
    std::fs::set_permissions(&hello, std::fs::Permissions::from_mode(0o755))?;
    std::fs::write(tools.join("docs/.wh.old-notes.txt"), "")?;
    Ok(())
}
