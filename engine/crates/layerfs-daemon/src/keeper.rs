//! The keeper: a small process that holds a copy of each FUSE mount's
//! `/dev/fuse` descriptor, so the mounts live through a daemon's crash or
//! upgrade and the next daemon serves them again (`layerfs_fuse::resume`).
//!
//! The daemon starts it (`layerfs keeper`, the same binary) when none runs
//! for its store, and talks to it over a Unix seqpacket socket beside the
//! control socket, in the same private directory: one message per request,
//! a descriptor riding along where one is given. The keeper knows nothing of
//! workspaces: it holds descriptors under the names it is given. It drops
//! a descriptor whose connection the kernel ended (the mount was taken
//! down), and it exits once it holds none and no daemon is connected.
//!
//! Messages (text, one per packet; names never hold spaces):
//! ```text
//! keep NAME MAJOR MINOR READAHEAD FLAGS  + descriptors  -> done
//! forget NAME                                          -> done
//! give                  -> kept NAME MAJOR MINOR READAHEAD FLAGS + descriptors, ..., end
//! ```
//! The descriptors are the session's device and, where the server keeps
//! one, its table of open files (`layerfs_fuse::Kept`); a keeper passes on
//! what it was given, so one from before the table holds just the device.

use std::collections::BTreeMap;
use std::io::{self, BufRead, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use layerfs_fuse::{Kept, KernelInit};
use rustix::event::{poll, PollFd, PollFlags};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

/// The longest message: a name of 64 bytes and four numbers.
const MESSAGE_MAX: usize = 256;
/// The most descriptors a message carries: a device and a table.
const FDS_MAX: usize = 2;
/// How long a keeper started for a daemon waits for it to connect.
const FIRST_CONNECTION: Duration = Duration::from_secs(10);

/// The daemon's side: one connection to the store's keeper.
pub struct Keeper {
    socket: OwnedFd,
}

impl Keeper {
    /// Connects to the keeper of the store at `root`, starting one with
    /// `program keeper --store ROOT` if none answers.
    pub fn connect_or_start(root: &Path, program: &Path) -> io::Result<Keeper> {
        let path = crate::paths::keeper_socket(root)?;
        if let Ok(keeper) = Keeper::connect(&path) {
            return Ok(keeper);
        }
        let mut child = std::process::Command::new(program)
            .arg("keeper")
            .arg("--store")
            .arg(root)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .current_dir("/")
            // Its own process group: a Ctrl-C meant for the daemon's
            // terminal does not reach it.
            .process_group(0)
            .spawn()?;
        let mut ready = String::new();
        let stdout = child.stdout.take().expect("piped");
        io::BufReader::new(stdout).read_line(&mut ready)?;
        if ready.trim() != "ready" {
            return Err(io::Error::other(format!(
                "the keeper did not start ({})",
                child.wait()?
            )));
        }
        Keeper::connect(&path)
    }

    fn connect(path: &Path) -> io::Result<Keeper> {
        let socket = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        rustix::net::connect(&socket, &SocketAddrUnix::new(path)?)?;
        Ok(Keeper { socket })
    }

    /// Has the keeper hold `kept` under `name`, in place of what it held
    /// under that name.
    pub fn keep(&self, name: &str, kept: &Kept) -> io::Result<()> {
        send(
            &self.socket,
            &kept_line("keep", name, kept.kernel),
            &descriptors(kept),
        )?;
        self.expect_done()
    }

    /// Has the keeper close what it holds under `name`.
    pub fn forget(&self, name: &str) -> io::Result<()> {
        send(&self.socket, &format!("forget {name}"), &[])?;
        self.expect_done()
    }

    /// Everything the keeper holds, by name; it goes on holding it.
    pub fn held(&self) -> io::Result<BTreeMap<String, Kept>> {
        send(&self.socket, "give", &[])?;
        let mut all = BTreeMap::new();
        loop {
            let (line, fds) = receive(&self.socket)?;
            if line == "end" {
                return Ok(all);
            }
            match (parse_kept(&line, "kept"), kept_from(fds)) {
                (Some((name, kernel)), Some((device, opens))) => {
                    all.insert(
                        name,
                        Kept {
                            device,
                            kernel,
                            opens,
                        },
                    );
                }
                _ => return Err(invalid(&line)),
            }
        }
    }

    fn expect_done(&self) -> io::Result<()> {
        match receive(&self.socket)? {
            (line, fds) if line == "done" && fds.is_empty() => Ok(()),
            (line, _) => Err(invalid(&line)),
        }
    }
}

/// Runs the keeper of the store at `root` until it holds nothing and no
/// daemon is connected. Prints `ready` once it listens; if another keeper
/// already serves the store, prints `ready` and leaves it to that one.
pub fn run(root: &Path) -> io::Result<()> {
    serve(&crate::paths::keeper_socket(root)?)
}

fn serve(path: &Path) -> io::Result<()> {
    if Keeper::connect(path).is_ok() {
        println!("ready");
        return Ok(());
    }
    // Whatever is at the path answers nobody: a dead keeper's socket.
    let _ = std::fs::remove_file(path);
    let listener = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::bind(&listener, &SocketAddrUnix::new(path)?)?;
    rustix::net::listen(&listener, 4)?;
    println!("ready");
    let mut held: BTreeMap<String, Kept> = BTreeMap::new();
    let mut daemon: Option<OwnedFd> = None;
    let mut ever_connected = false;
    loop {
        // One daemon at a time: the next is accepted once the last is gone.
        let mut fds: Vec<PollFd> = match &daemon {
            Some(d) => vec![PollFd::new(d, PollFlags::IN)],
            None => vec![PollFd::new(&listener, PollFlags::IN)],
        };
        fds.extend(
            held.values()
                .map(|k| PollFd::new(&k.device, PollFlags::empty())),
        );
        let idle = daemon.is_none() && held.is_empty();
        let timeout = rustix::time::Timespec::try_from(FIRST_CONNECTION).expect("fits");
        let ready = poll(&mut fds, (idle && !ever_connected).then_some(&timeout))?;
        if ready == 0 {
            break;
        }
        let first = fds[0].revents();
        // A connection the kernel ended (ERR), or taken down: dropped.
        let ended: Vec<String> = held
            .keys()
            .zip(&fds[1..])
            .filter(|(_, fd)| !fd.revents().is_empty())
            .map(|(name, _)| name.clone())
            .collect();
        drop(fds);
        for name in ended {
            tracing::info!("keeper: {name}'s FUSE connection ended");
            held.remove(&name);
        }
        match &daemon {
            _ if first.is_empty() => {}
            Some(d) => match serve_one(d, &mut held) {
                Ok(true) => {}
                Ok(false) => daemon = None,
                Err(e) => {
                    tracing::warn!("keeper: the daemon's connection: {e}");
                    daemon = None;
                }
            },
            None => {
                let conn = rustix::net::accept_with(&listener, SocketFlags::CLOEXEC)?;
                let peer = rustix::net::sockopt::socket_peercred(&conn)?;
                if peer.uid == rustix::process::geteuid() {
                    daemon = Some(conn);
                    ever_connected = true;
                }
            }
        }
        if daemon.is_none() && held.is_empty() && ever_connected {
            break;
        }
    }
    let _ = std::fs::remove_file(path);
    Ok(())
}

/// Answers one message of the daemon; false once it has gone.
fn serve_one(daemon: &OwnedFd, held: &mut BTreeMap<String, Kept>) -> io::Result<bool> {
    let (line, fds) = match receive(daemon) {
        Ok(got) => got,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(e),
    };
    let mut words = line.split(' ');
    match (words.next(), fds.is_empty()) {
        (Some("keep"), false) => {
            let (name, kernel) = parse_kept(&line, "keep").ok_or_else(|| invalid(&line))?;
            let (device, opens) = kept_from(fds).ok_or_else(|| invalid(&line))?;
            held.insert(
                name,
                Kept {
                    device,
                    kernel,
                    opens,
                },
            );
        }
        (Some("forget"), true) => {
            let name = words.next().ok_or_else(|| invalid(&line))?;
            held.remove(name);
        }
        (Some("give"), true) => {
            for (name, k) in held.iter() {
                send(daemon, &kept_line("kept", name, k.kernel), &descriptors(k))?;
            }
            send(daemon, "end", &[])?;
            return Ok(true);
        }
        _ => return Err(invalid(&line)),
    }
    send(daemon, "done", &[])?;
    Ok(true)
}

/// The descriptors a message carries for `kept`: its device, then its table.
fn descriptors(kept: &Kept) -> Vec<BorrowedFd<'_>> {
    let mut fds = vec![kept.device.as_fd()];
    fds.extend(kept.opens.as_ref().map(|t| t.as_fd()));
    fds
}

/// The device and table [`descriptors`] sent; None for no descriptor.
fn kept_from(fds: Vec<OwnedFd>) -> Option<(OwnedFd, Option<OwnedFd>)> {
    let mut fds = fds.into_iter();
    let device = fds.next()?;
    Some((device, fds.next()))
}

/// `VERB NAME MAJOR MINOR READAHEAD FLAGS`, as [`parse_kept`] reads it.
fn kept_line(verb: &str, name: &str, k: KernelInit) -> String {
    format!(
        "{verb} {name} {} {} {} {}",
        k.major, k.minor, k.max_readahead, k.flags
    )
}

/// `VERB NAME MAJOR MINOR READAHEAD FLAGS`.
fn parse_kept(line: &str, verb: &str) -> Option<(String, KernelInit)> {
    let mut words = line.split(' ');
    if words.next()? != verb {
        return None;
    }
    let name = words.next()?.to_string();
    let mut number = || words.next()?.parse::<u64>().ok();
    let kernel = KernelInit {
        major: u32::try_from(number()?).ok()?,
        minor: u32::try_from(number()?).ok()?,
        max_readahead: u32::try_from(number()?).ok()?,
        flags: number()?,
    };
    Some((name, kernel))
}

fn invalid(line: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("keeper: unexpected message {line:?}"),
    )
}

fn send(socket: &OwnedFd, line: &str, fds: &[BorrowedFd]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_MAX))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        control.push(SendAncillaryMessage::ScmRights(fds));
    }
    rustix::net::sendmsg(
        socket,
        &[IoSlice::new(line.as_bytes())],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// One message and the descriptors that came with it; UnexpectedEof once
/// the other side has gone.
fn receive(socket: &OwnedFd) -> io::Result<(String, Vec<OwnedFd>)> {
    let mut buf = [0u8; MESSAGE_MAX];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_MAX))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        socket,
        &mut [IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = message {
            fds.extend(got);
        }
    }
    if got.bytes == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let line = std::str::from_utf8(&buf[..got.bytes]).map_err(|_| invalid("(not UTF-8)"))?;
    Ok((line.to_string(), fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_line_reads_back_as_written() {
        let kernel = KernelInit {
            major: 7,
            minor: 41,
            max_readahead: 131072,
            flags: u64::MAX,
        };
        let line = kept_line("keep", "w-1", kernel);
        assert_eq!(line, format!("keep w-1 7 41 131072 {}", u64::MAX));
        assert_eq!(parse_kept(&line, "keep"), Some(("w-1".into(), kernel)));
        assert_eq!(parse_kept(&line, "kept"), None, "another verb");
        assert_eq!(parse_kept("keep w 7 41", "keep"), None, "short");
        assert_eq!(
            parse_kept("keep w 7 99999999999 1 1", "keep"),
            None,
            "too large"
        );
    }

    #[test]
    fn a_keeper_holds_descriptors_across_daemons_and_leaves_once_idle() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keeper.sock");
        let keeper = std::thread::spawn({
            let path = path.clone();
            move || serve(&path)
        });
        let daemon = loop {
            match Keeper::connect(&path) {
                Ok(k) => break k,
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        let file = tempfile::tempfile().unwrap();
        let kernel = KernelInit {
            major: 7,
            minor: 41,
            max_readahead: 4096,
            flags: 1 << 37,
        };
        let kept = Kept {
            device: file.into(),
            kernel,
            opens: Some(tempfile::tempfile().unwrap().into()),
        };
        let bare = Kept {
            device: kept.device.try_clone().unwrap(),
            kernel,
            opens: None,
        };
        daemon.keep("a", &kept).unwrap();
        daemon.keep("b", &kept).unwrap();
        daemon.keep("c", &bare).unwrap();
        daemon.forget("b").unwrap();
        drop(daemon);
        // The next daemon gets what the last one left.
        let next = Keeper::connect(&path).unwrap();
        let held = next.held().unwrap();
        assert_eq!(held.keys().collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(held["a"].kernel, kernel);
        let same = |a: &OwnedFd, b: &OwnedFd| {
            let (a, b) = (rustix::fs::fstat(a).unwrap(), rustix::fs::fstat(b).unwrap());
            (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
        };
        assert!(same(&held["a"].device, &kept.device), "the same open file");
        let table = |k: &Kept| k.opens.as_ref().map(|t| t.try_clone().unwrap());
        assert!(
            same(&table(&held["a"]).unwrap(), &table(&kept).unwrap()),
            "the same table"
        );
        assert!(held["c"].opens.is_none(), "a session kept without a table");
        next.forget("a").unwrap();
        next.forget("c").unwrap();
        drop(next);
        keeper.join().unwrap().unwrap();
        assert!(!path.exists(), "the keeper took its socket away");
    }
}
