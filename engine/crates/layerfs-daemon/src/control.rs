//! The control socket: a Unix socket in a directory only its user can open,
//! which also admits only the daemon's own uid and root by their peer
//! credentials. One thread per client, a bounded number of clients.

use std::io::{self, BufReader};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::protocol::{
    read_message, write_message, ControlError, ErrorKind, Message, Progress, Reply, Request,
    MAX_MESSAGE, MAX_REPLY,
};

/// Answers one request; long ones tell the `Progress` callback as they go.
pub type Handler = dyn Fn(Request, &mut dyn FnMut(Progress)) -> Reply + Send + Sync;

/// Progress lines at most this often.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// Clients served at once; more are told to try again.
const MAX_CLIENTS: usize = 32;
/// A client silent this long between requests is disconnected.
const CLIENT_IDLE: Duration = Duration::from_secs(60);

/// Binds the control socket at `path`, replacing a socket a dead daemon left
/// (the caller holds the store's lock, so no live daemon owns it).
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        crate::paths::private_dir(dir)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    UnixListener::bind(path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot listen on {}: {e}", path.display()),
        )
    })
}

/// Serves clients of `listener` with `handle`, on a thread of its own.
pub fn spawn(
    listener: UnixListener,
    handle: Arc<Handler>,
) -> io::Result<std::thread::JoinHandle<()>> {
    let clients = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("layerfs-control".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                if clients.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
                    clients.fetch_sub(1, Ordering::AcqRel);
                    let busy = ControlError::new(ErrorKind::Busy, "the daemon is busy: try again");
                    let _ = write_message(&mut &stream, &Reply::Error(busy));
                    continue;
                }
                let (handle, clients) = (handle.clone(), clients.clone());
                let spawned = std::thread::Builder::new()
                    .name("layerfs-client".into())
                    .spawn(move || {
                        serve_client(stream, &*handle);
                        clients.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    tracing::warn!("cannot start a thread for a control client");
                }
            }
        })
}

/// Whether a client of this uid may talk to a daemon running as `own`.
pub fn admitted(uid: u32, own: u32) -> bool {
    uid == own || uid == 0
}

fn serve_client(stream: UnixStream, handle: &Handler) {
    let own = rustix::process::geteuid().as_raw();
    match peer_uid(&stream) {
        Ok(uid) if admitted(uid, own) => {}
        Ok(uid) => {
            tracing::warn!(uid, "control client refused: not this daemon's user");
            let why = format!("uid {uid} may not control the daemon of uid {own}");
            let _ = write_message(
                &mut &stream,
                &Reply::Error(ControlError::new(ErrorKind::Denied, why)),
            );
            linger_for_reading(&stream);
            return;
        }
        Err(e) => {
            tracing::warn!("control client refused: no peer credentials: {e}");
            return;
        }
    }
    let _ = stream.set_read_timeout(Some(CLIENT_IDLE));
    let mut input = BufReader::new(&stream);
    loop {
        let line = match read_message(&mut input, MAX_MESSAGE) {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(e) => {
                // Past a bad frame the stream cannot be followed: answer, close.
                let _ = write_message(&mut &stream, &Reply::Error(bad_request(e)));
                return;
            }
        };
        // The first progress at once, then at most one per PROGRESS_EVERY.
        let mut last: Option<std::time::Instant> = None;
        let mut progress = |p: Progress| {
            if last.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
                last = Some(std::time::Instant::now());
                let _ = write_message(&mut &stream, &Message::Progress { progress: p });
            }
        };
        let reply = match serde_json::from_slice::<Request>(&line) {
            Ok(request) => handle(request, &mut progress),
            Err(e) => Reply::Error(bad_request(e)),
        };
        if write_message(&mut &stream, &reply).is_err() {
            return;
        }
    }
}

fn bad_request(e: impl std::fmt::Display) -> ControlError {
    ControlError::new(ErrorKind::BadRequest, format!("bad request: {e}"))
}

/// Lets a refused client read its answer: closing a Unix socket with its
/// request unread would reset the connection before the client reads.
/// What it sent is read (a bounded amount, briefly) and dropped.
fn linger_for_reading(stream: &UnixStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = io::copy(&mut io::Read::take(stream, 64 * 1024), &mut io::sink());
}

/// The uid of the process at the other end of `stream`.
#[allow(unsafe_code)]
fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    #[cfg(target_os = "linux")]
    {
        let cred = rustix::net::sockopt::socket_peercred(stream.as_fd())?;
        Ok(cred.uid.as_raw())
    }
    #[cfg(target_os = "macos")]
    {
        use std::os::fd::AsRawFd;
        let (mut uid, mut gid) = (0, 0);
        // SAFETY: a valid socket and two out-pointers to locals.
        if unsafe { libc::getpeereid(stream.as_fd().as_raw_fd(), &mut uid, &mut gid) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(uid)
    }
}

/// Sends `request` to the daemon at `socket` and returns its reply.
pub fn call(socket: &Path, request: &Request) -> io::Result<Reply> {
    call_with_progress(socket, request, &mut |_| {})
}

/// [`call`], telling `progress` what the daemon says of a long request.
pub fn call_with_progress(
    socket: &Path,
    request: &Request,
    progress: &mut dyn FnMut(Progress),
) -> io::Result<Reply> {
    let stream = UnixStream::connect(socket)?;
    write_message(&mut &stream, request)?;
    let mut input = BufReader::new(&stream);
    loop {
        let line = read_message(&mut input, MAX_REPLY)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the daemon closed the connection",
            )
        })?;
        match serde_json::from_slice(&line) {
            Ok(Message::Progress { progress: p }) => progress(p),
            Ok(Message::Reply(reply)) => return Ok(reply),
            Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Response;

    #[test]
    fn only_the_daemons_user_and_root_are_admitted() {
        assert!(admitted(1000, 1000));
        assert!(admitted(0, 1000));
        assert!(!admitted(1001, 1000));
        assert!(admitted(0, 0));
        assert!(!admitted(65534, 0));
    }

    #[test]
    fn progress_comes_before_the_reply_and_no_more_often_than_set() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("s");
        let listener = UnixListener::bind(&socket).unwrap();
        let handler: Arc<Handler> = Arc::new(|request, progress| {
            for done in 1..=1000 {
                progress(Progress::of(done, 1000));
            }
            Reply::Ok(Response::Removed(format!("{request:?}")))
        });
        spawn(listener, handler).unwrap();
        let mut seen = Vec::new();
        let reply = call_with_progress(&socket, &Request::Ls, &mut |p| seen.push(p)).unwrap();
        assert_eq!(reply, Reply::Ok(Response::Removed("Ls".into())));
        assert_eq!(seen.first(), Some(&Progress::of(1, 1000)));
        assert!(seen.len() < 100, "{} progress lines", seen.len());
        // Without a progress callback the reply is the same.
        assert_eq!(
            call(&socket, &Request::Ls).unwrap(),
            Reply::Ok(Response::Removed("Ls".into()))
        );
        // A line that is no request is answered with its kind.
        let stream = UnixStream::connect(&socket).unwrap();
        write_message(&mut &stream, &serde_json::json!({"op": "no_such"})).unwrap();
        let line = read_message(&mut BufReader::new(&stream), MAX_REPLY)
            .unwrap()
            .unwrap();
        match serde_json::from_slice::<Reply>(&line).unwrap() {
            Reply::Error(e) => assert_eq!(e.kind, ErrorKind::BadRequest, "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
