//! Every server in a process of its own, started and stopped by the load
//! generator, and what the kernel says each process spent.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// One server process and where it answers.
pub struct Server {
    pub name: &'static str,
    pub nfs: SocketAddr,
    pub mount: SocketAddr,
    /// The path its MOUNT service exports the tree at.
    pub path: String,
    child: Child,
    /// Held open: a peer serves until it closes.
    _stdin: Option<ChildStdin>,
}

/// What a server process spent, from `/proc/PID/stat`: threads that ended
/// count too.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    /// User and system CPU time, in clock ticks.
    pub cpu_ticks: u64,
    /// System calls of every kind, when counted ([`SyscallCount`]).
    pub syscalls: Option<u64>,
}

impl Usage {
    pub fn since(self, before: Usage) -> Usage {
        Usage {
            cpu_ticks: self.cpu_ticks - before.cpu_ticks,
            syscalls: self.syscalls,
        }
    }

    pub fn cpu(self) -> Duration {
        Duration::from_secs_f64(self.cpu_ticks as f64 / clock_ticks() as f64)
    }
}

fn clock_ticks() -> u64 {
    rustix::param::clock_ticks_per_second()
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn usage(&self) -> Usage {
        let pid = self.pid();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Fields after the command name, which may hold spaces: state is
        // field 3, utime 14 and stime 15.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        Usage {
            cpu_ticks: field(14).unwrap_or(0) + field(15).unwrap_or(0),
            syscalls: None,
        }
    }

    /// Resident memory, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self._stdin.take();
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A command whose process gets SIGTERM when this one ends, however it
/// ends: no server outlives an interrupted run.
fn child_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program);
    // SAFETY: prctl is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
                .map_err(std::io::Error::from)
        });
    }
    cmd
}

/// Reads the child's standard output until a line starts with `prefix`;
/// returns the rest of that line.
fn wait_for_line(child: &mut Child, prefix: &str) -> Result<String, String> {
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(out).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(rest) = line.strip_prefix(prefix) {
                    // Keep draining its output so it never blocks on a full pipe.
                    std::thread::spawn(move || lines.for_each(drop));
                    return Ok(rest.trim().to_string());
                }
            }
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err(format!("exited before printing {prefix:?}")),
        }
    }
}

/// `layerfs serve ARGS... --listen 127.0.0.1:0`, its handle key kept under
/// `state` (not in the user's store).
pub fn layerfs(
    name: &'static str,
    bin: &Path,
    args: &[&std::ffi::OsStr],
    state: &Path,
) -> Result<Server, String> {
    let mut child = child_command(bin)
        .arg("serve")
        .args(args)
        .args(["--listen", "127.0.0.1:0"])
        .env("XDG_DATA_HOME", state)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let addr: SocketAddr = wait_for_line(&mut child, "listening on ")?
        .parse()
        .map_err(|e| format!("{name}: {e}"))?;
    Ok(Server {
        name,
        nfs: addr,
        mount: addr,
        path: "/".into(),
        child,
        _stdin: None,
    })
}

/// A peer served by this program in a child process (`--serve KIND`).
pub fn peer(name: &'static str) -> Result<Server, String> {
    child_peer(name, name).map(|(server, _)| server)
}

/// The raw TCP floors in a child process: the server, and the address of
/// the one with 1 MiB replies (`nfs` has NULL-sized replies).
pub fn floors() -> Result<(Server, SocketAddr), String> {
    let (server, ports) = child_peer("tcp floor", "floor")?;
    let big = ports.get(1).ok_or("the floor gave one port")?;
    Ok((server, SocketAddr::from(([127, 0, 0, 1], *big))))
}

fn child_peer(name: &'static str, kind: &str) -> Result<(Server, Vec<u16>), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = child_command(exe)
        .args(["--huge", &crate::peers::huge_files().to_string()])
        .args(["--serve", kind])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {name}: {e}"))?;
    let stdin = child.stdin.take();
    let line = wait_for_line(&mut child, "ready ")?;
    let ports: Vec<u16> = line
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    let addr = SocketAddr::from(([127, 0, 0, 1], *ports.first().ok_or("no port")?));
    let server = Server {
        name,
        nfs: addr,
        mount: addr,
        path: "/".into(),
        child,
        _stdin: stdin,
    };
    Ok((server, ports))
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// nfs-ganesha with FSAL VFS exporting `dir`, bound to 127.0.0.1, NFSv3
/// over TCP only; `None` (and why) when it is not installed or this is not
/// root.
pub fn ganesha(dir: &Path, state: &Path) -> Result<Server, String> {
    let bin = ["/usr/bin/ganesha.nfsd", "/usr/sbin/ganesha.nfsd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or("ganesha.nfsd is not installed (Debian: nfs-ganesha nfs-ganesha-vfs)")?;
    if !rustix::process::geteuid().is_root() {
        return Err("nfs-ganesha needs root".into());
    }
    // ganesha exits (status 2) when it cannot register with rpcbind. Not
    // started here: it listens on port 111 of every interface (the run
    // script starts one in a network namespace of the run's own).
    if TcpStream::connect(("127.0.0.1", 111)).is_err() {
        return Err(
            "nfs-ganesha serves only once registered with rpcbind, which is not \
                    running: start it (rpcbind) and run again"
                .into(),
        );
    }
    let (nfs, mount) = (free_port()?, free_port()?);
    let conf = state.join("ganesha.conf");
    let export = dir.display();
    std::fs::write(
        &conf,
        format!(
            "NFS_CORE_PARAM {{ Bind_addr = 127.0.0.1; NFS_Port = {nfs}; MNT_Port = {mount}; \
             Protocols = 3; Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false; }}\n\
             NFS_KRB5 {{ Active_krb5 = false; }}\n\
             EXPORT {{ Export_Id = 1; Path = {export}; Pseudo = {export}; Access_Type = RW; \
             Squash = No_Root_Squash; Protocols = 3; Transports = TCP; SecType = sys; \
             FSAL {{ Name = VFS; }} }}\n\
             LOG {{ Default_Log_Level = FATAL; }}\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let child = child_command(bin)
        .arg("-F")
        .arg("-f")
        .arg(&conf)
        .arg("-L")
        .arg(state.join("ganesha.log"))
        .arg("-p")
        .arg(state.join("ganesha.pid"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start ganesha.nfsd: {e}"))?;
    let nfs = SocketAddr::from(([127, 0, 0, 1], nfs));
    let mut server = Server {
        name: "nfs-ganesha",
        nfs,
        mount: SocketAddr::from(([127, 0, 0, 1], mount)),
        path: export.to_string(),
        child,
        _stdin: None,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(server.mount).is_err() || TcpStream::connect(nfs).is_err() {
        if Instant::now() > deadline {
            return Err("nfs-ganesha did not listen within 30 s".into());
        }
        if let Ok(Some(status)) = server.child.try_wait() {
            // The state directory goes with the run: quote the log's reason.
            let log = std::fs::read_to_string(state.join("ganesha.log")).unwrap_or_default();
            let why = log
                .lines()
                .rfind(|l| (l.contains(":MAJ :") || l.contains(":CRIT :")) && !l.contains("DBUS"))
                .unwrap_or("no reason logged");
            return Err(format!("ganesha.nfsd exited ({status}): {why}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(server)
}

/// Counts a process's system calls over a run with `perf stat` on the
/// `raw_syscalls:sys_enter` tracepoint: counted in the kernel, a few tens of
/// nanoseconds per call, the same for every server.
pub struct SyscallCount(Child);

impl SyscallCount {
    /// `None` when perf cannot count here (not installed, no tracefs).
    pub fn start(server: &Server) -> Option<SyscallCount> {
        let child = Command::new("perf")
            .args(["stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p"])
            .arg(server.pid().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .ok()?;
        // perf attaches to the process's threads before counting starts.
        std::thread::sleep(Duration::from_millis(150));
        Some(SyscallCount(child))
    }

    /// The system calls counted since `start`.
    pub fn stop(self) -> Option<u64> {
        let pid = rustix::process::Pid::from_raw(self.0.id() as i32)?;
        rustix::process::kill_process(pid, rustix::process::Signal::INT).ok()?;
        let out = self.0.wait_with_output().ok()?;
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .find(|l| l.contains("raw_syscalls:sys_enter"))
            .and_then(|l| l.split(',').next()?.parse().ok())
    }
}
