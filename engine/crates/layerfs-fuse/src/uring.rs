//! FUSE over io_uring (Linux 6.14): each CPU's requests answered on that CPU.
//!
//! Through `/dev/fuse` a request wakes whichever door thread waited longest,
//! wherever it sleeps, and its reply wakes the caller there: on a machine
//! that halts idle CPUs, each of those wake-ups across CPUs costs more than
//! the request itself (docs/benchmarks.md). With FUSE over io_uring the
//! kernel queues a request on the ring of the CPU its caller runs on; a
//! thread kept on that CPU takes it, and the caller is woken from there.
//!
//! Each CPU has a thread kept on it that fetches its ring's requests and
//! commits their answers. It answers the requests each file copied in,
//! removed or first appended to costs itself, and READ and WRITE
//! ([`crate::wire`]); fuser reads requests only from a descriptor, so any
//! other goes through a socket to a fuser session of that CPU (a thread
//! kept there too) and back. Large READs go to a reader thread of the ring,
//! kept nowhere, so that the reader's CPU is not the only one copying.
//!
//! The kernel still sends FORGETs and INTERRUPTs through `/dev/fuse`, where
//! the session that answered FUSE_INIT goes on reading, FORGETs in batches
//! ([`crate::forgets`]).

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use rustix::event::{eventfd, EventfdFlags};
use rustix::net::{
    recvmsg, sendmsg, socketpair, AddressFamily, RecvAncillaryBuffer, RecvFlags,
    SendAncillaryBuffer, SendFlags, SocketFlags, SocketType,
};

use crate::door::Door;
use crate::handover::KernelInit;
use zerocopy::{FromZeros, IntoBytes};

use crate::abi::{self, InHeader, ReadIn, UringCmdReq, UringReqHeader};
use crate::wire::{self, Answered, IN_HEADER_LEN, OUT_HEADER_LEN};

/// `enum fuse_uring_cmd`.
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// A slot's header buffer, as the kernel registers it.
const HEADER_LEN: usize = std::mem::size_of::<UringReqHeader>();

/// Requests each CPU's ring holds at once.
const DEPTH: usize = 2;

/// The largest request or answer body: the kernel refuses a buffer smaller
/// than its `max_write` or `max_pages`.
const PAYLOAD_LEN: usize = crate::door::MAX_WRITE as usize;

/// The most a listing (READDIR, READDIRPLUS) through the session may
/// return: the kernel asks for as much as the caller's buffer holds, up to
/// 1 MiB, and takes less. With it, no request or answer through the
/// session is larger than an extended attribute (64 KiB) and its name.
const LISTING_MAX: u32 = 64 * 1024;

/// Socket buffers for one such message and more, within the limit a user
/// may set (`net.core.wmem_max`; the kernel caps the setting there).
const SOCKET_BUFFER: usize = 256 * 1024;

/// One request's buffers, registered with the kernel once.
struct Slot {
    header: Box<UringReqHeader>,
    payload: Vec<u8>,
    /// `struct iovec[2]` naming them (address, length, address, length),
    /// for the registration; the buffers stay where they are when the
    /// slot moves.
    iov: Box<[usize; 4]>,
}

impl Slot {
    fn new() -> Slot {
        let mut header = Box::new(UringReqHeader::new_zeroed());
        let mut payload = vec![0u8; PAYLOAD_LEN];
        let iov = Box::new([
            header.as_mut_bytes().as_mut_ptr() as usize,
            HEADER_LEN,
            payload.as_mut_ptr() as usize,
            PAYLOAD_LEN,
        ]);
        Slot {
            header,
            payload,
            iov,
        }
    }

    /// The request's header, where the kernel put it.
    fn in_header(&self) -> InHeader {
        abi::args(&self.header.in_out).expect("128 bytes hold an in header")
    }
}

/// The 80 command bytes, beginning with a `struct fuse_uring_cmd_req`.
fn command(qid: u16, commit_id: u64) -> [u8; 80] {
    let req = UringCmdReq {
        commit_id,
        qid,
        ..Default::default()
    };
    let mut cmd = [0u8; 80];
    req.write_to_prefix(&mut cmd)
        .expect("80 bytes hold a command");
    cmd
}

/// io-uring's builder has no field for `len`, which a REGISTER must set to
/// the number of iovecs (two).
#[allow(unsafe_code)]
fn with_len(entry: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: Entry128 is repr(C): an io_uring_sqe (64 bytes, plain
    // integers) then 64 command bytes, and any bytes are a valid value of
    // it. `len` is the sqe's u32 at byte 24.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(entry) };
    bytes[24..28].copy_from_slice(&len.to_ne_bytes());
    unsafe { std::mem::transmute(bytes) }
}

/// One CPU's queue, ready to serve.
struct Queue {
    cpu: usize,
    device: OwnedFd,
    /// The ring's end of the socket to `session`.
    socket: OwnedFd,
    session: fuser::Session<Door>,
    door: Door,
    /// The door of the thread large READs are handed to.
    reader: Door,
}

/// Starts a ring and a fuser session for each CPU the kernel may queue a
/// request on; `door` makes each one's door. The kernel takes requests to
/// the rings once every CPU's has registered; until then, or if one
/// fails, they come through `/dev/fuse`.
pub(crate) fn start(
    device: &OwnedFd,
    kernel: KernelInit,
    config: &fuser::Config,
    mut door: impl FnMut() -> Door,
) -> io::Result<()> {
    let mut queues = Vec::new();
    for cpu in 0..possible_cpus() {
        let (socket, theirs) = socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        for fd in [&socket, &theirs] {
            rustix::net::sockopt::set_socket_send_buffer_size(fd, SOCKET_BUFFER)?;
            rustix::net::sockopt::set_socket_recv_buffer_size(fd, SOCKET_BUFFER)?;
        }
        // The session starts by reading an INIT: the kernel's, rebuilt.
        rustix::io::write(&socket, &kernel.request())?;
        let mut sibling = config.clone();
        sibling.n_threads = Some(1);
        sibling.clone_fd = false;
        let session = fuser::Session::from_fd(door(), theirs, sibling.acl, sibling)?;
        let mut answer = [0u8; 256];
        rustix::io::read(&socket, &mut answer)?;
        queues.push(Queue {
            cpu,
            device: device.try_clone()?,
            socket,
            session,
            door: door(),
            reader: door(),
        });
    }
    for q in queues {
        let cpu = q.cpu;
        on_cpu(cpu, format!("fuse-session-{cpu}"), move || {
            if let Err(e) = q.session.run() {
                tracing::debug!("FUSE session of CPU {cpu} ended: {e}");
            }
        })?;
        let reader = Reader::start(cpu, q.reader)?;
        on_cpu(cpu, format!("fuse-ring-{cpu}"), move || {
            let ended = serve(cpu as u16, &q.device, &q.socket, &q.door, reader);
            // The session's end: DESTROY, which fuser answers, and then
            // returns.
            if rustix::io::write(&q.socket, destroy().as_bytes()).is_ok() {
                let _ = rustix::io::read(&q.socket, &mut [0u8; OUT_HEADER_LEN]);
            }
            if let Err(e) = ended {
                tracing::warn!("FUSE ring of CPU {cpu} ended: {e}");
            }
        })?;
    }
    Ok(())
}

/// The number of CPUs the kernel may run a caller on, one queue each:
/// `/sys/devices/system/cpu/possible` ("0-63"), else those configured.
fn possible_cpus() -> usize {
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible").ok();
    let last = possible
        .as_deref()
        .and_then(|s| s.trim().rsplit(['-', ',']).next()?.parse::<usize>().ok());
    match last {
        Some(last) => last + 1,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// A FUSE_DESTROY request, as a session reads it.
fn destroy() -> InHeader {
    const FUSE_DESTROY: u32 = 38;
    InHeader {
        len: IN_HEADER_LEN as u32,
        opcode: FUSE_DESTROY,
        ..Default::default()
    }
}

fn on_cpu(
    cpu: usize,
    name: String,
    run: impl FnOnce() + Send + 'static,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name).spawn(move || {
        let mut set = rustix::thread::CpuSet::new();
        set.set(cpu);
        if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
            tracing::debug!("thread not kept on CPU {cpu}: {e}");
        }
        run()
    })
}

/// Large READs of one ring, answered on a thread of their own: a ring's
/// thread stays on its CPU, and a reader there would otherwise wait for
/// each READ to be copied before it copies the last one out, where
/// through `/dev/fuse` another CPU fills the next while it does.
struct Reader {
    jobs: mpsc::Sender<(usize, Box<Slot>)>,
    done: mpsc::Receiver<(usize, Box<Slot>)>,
    /// Written by the reader thread after each READ, to wake the ring.
    wake: Arc<OwnedFd>,
}

/// A READ at least this large goes to the ring's reader thread. The
/// readahead of a door run as root asks 1 MiB at a time: a cold 1 GiB
/// read took 0.58-0.63 s on the ring's thread and 0.46-0.48 s handed to
/// the reader. A user's door asks 128 KiB (the kernel's default window):
/// 0.62-0.74 s on the ring's thread, 0.69-0.78 s handed over (0.46-0.51 s
/// through `/dev/fuse`).
const LARGE_READ: u32 = 256 * 1024;

/// The ring's user data of the wake-up poll (slots are 0..DEPTH).
const WAKE: u64 = u64::MAX;

impl Reader {
    fn start(cpu: usize, door: Door) -> io::Result<Reader> {
        let (jobs, inbox) = mpsc::channel::<(usize, Box<Slot>)>();
        let (outbox, done) = mpsc::channel();
        let wake = Arc::new(eventfd(0, EventfdFlags::CLOEXEC)?);
        let woken = wake.clone();
        std::thread::Builder::new()
            .name(format!("fuse-read-{cpu}"))
            .spawn(move || {
                let mut answered = Answered::default();
                for (i, mut slot) in inbox {
                    answer(&mut slot, None, &door, &mut answered);
                    if outbox.send((i, slot)).is_err() {
                        return;
                    }
                    let _ = rustix::io::write(&*woken, &1u64.to_ne_bytes());
                }
            })?;
        Ok(Reader { jobs, done, wake })
    }
}

/// Fetches the requests of queue `qid` and answers each: itself, through
/// `session`, or (a large READ) through `reader`.
fn serve(
    qid: u16,
    device: &OwnedFd,
    session: &OwnedFd,
    door: &Door,
    reader: Reader,
) -> io::Result<()> {
    // Declared before the ring, so dropped after it: the kernel writes
    // requests into them until the ring is gone.
    let mut slots: Vec<Option<Box<Slot>>> =
        (0..DEPTH).map(|_| Some(Box::new(Slot::new()))).collect();
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> =
        IoUring::builder().build(2 * DEPTH as u32 + 2)?;
    let mut answered = Answered::default();
    let fd = types::Fd(device.as_raw_fd());
    for (i, slot) in slots.iter().enumerate() {
        let slot = slot.as_ref().unwrap();
        let entry = opcode::UringCmd80::new(fd, CMD_REGISTER)
            .cmd(command(qid, 0))
            .addr(Some(slot.iov.as_ptr() as u64))
            .build()
            .user_data(i as u64);
        push(&mut ring, with_len(entry, 2))?;
    }
    let wake = types::Fd(reader.wake.as_raw_fd());
    let poll = || {
        squeue::Entry128::from(
            opcode::PollAdd::new(wake, libc::POLLIN as u32)
                .build()
                .user_data(WAKE),
        )
    };
    push(&mut ring, poll())?;
    let commit = |slot: &Slot, i: usize| {
        opcode::UringCmd80::new(fd, CMD_COMMIT_AND_FETCH)
            .cmd(command(qid, slot.header.ent.commit_id))
            .build()
            .user_data(i as u64)
    };
    let mut done: Vec<(u64, i32)> = Vec::with_capacity(DEPTH + 1);
    let mut serving = false;
    // Requests this ring was given, logged at each power of ten: what
    // shows that requests came through the rings, not /dev/fuse.
    let (mut given, mut next_logged): (u64, u64) = (0, 1);
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        done.clear();
        done.extend(ring.completion().map(|c| (c.user_data(), c.result())));
        for &(data, result) in &done {
            if data == WAKE {
                let _ = rustix::io::read(&*reader.wake, &mut [0u8; 8]);
                for (i, slot) in reader.done.try_iter() {
                    push(&mut ring, commit(&slot, i))?;
                    slots[i] = Some(slot);
                }
                push(&mut ring, poll())?;
                continue;
            }
            if result < 0 {
                if result == -libc::ENOTCONN || result == -libc::ECANCELED {
                    return Ok(());
                }
                return Err(io::Error::from_raw_os_error(-result));
            }
            if !serving {
                door.rings_serve();
                serving = true;
            }
            given += 1;
            if given == next_logged {
                tracing::info!("FUSE ring of CPU {qid} has been given {given} requests");
                next_logged = next_logged.saturating_mul(10);
            }
            let i = data as usize;
            let Some(mut slot) = slots[i].take() else {
                return Err(io::Error::other("a request in a buffer lent to the reader"));
            };
            if is_large_read(&slot) {
                reader
                    .jobs
                    .send((i, slot))
                    .map_err(|_| io::Error::other("the reader thread is gone"))?;
                continue;
            }
            answer(&mut slot, Some(session), door, &mut answered);
            push(&mut ring, commit(&slot, i))?;
            slots[i] = Some(slot);
        }
    }
}

fn is_large_read(slot: &Slot) -> bool {
    slot.in_header().opcode == wire::READ
        && wire::read_in(&slot.header.op_in).is_some_and(|(_, size)| size >= LARGE_READ)
}

fn push(
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    entry: squeue::Entry128,
) -> io::Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: every buffer the entry names (a slot's iovecs, header and
    // payload) lives as long as the ring: the slots are dropped after it.
    unsafe { ring.submission().push(&entry) }
        .map_err(|_| io::Error::other("the ring's submission queue is full"))
}

/// Answers the request in `slot` there, as the kernel reads it: the out
/// header where the request's header was, the body in the payload. What
/// the door does not answer itself goes through `session`. A request that
/// cannot be answered is answered EIO: its caller, and every later one on
/// this CPU, would otherwise wait for ever.
fn answer(slot: &mut Slot, session: Option<&OwnedFd>, door: &Door, answered: &mut Answered) {
    let header = slot.in_header();
    let payload = slot.header.ent.payload_sz as usize;
    let op = (header.len as usize)
        .checked_sub(IN_HEADER_LEN + payload)
        .filter(|op| *op <= abi::URING_HEADER_SZ && payload <= PAYLOAD_LEN);
    let Some(op) = op else {
        tracing::warn!(
            "FUSE request {} of {} bytes with {payload} in its payload: answered EIO",
            header.opcode,
            header.len
        );
        return answer_with(slot, header.unique, -libc::EIO, 0);
    };
    // A READ's data goes straight into the ring's buffer.
    if let Some((offset, size)) = (header.opcode == wire::READ)
        .then(|| wire::read_in(&slot.header.op_in[..op]))
        .flatten()
    {
        let size = (size as usize).min(PAYLOAD_LEN);
        let ino = fuser::INodeNo(header.nodeid);
        if let Some(read) = door.read_into(ino, offset, &mut slot.payload[..size]) {
            return match read {
                Ok(len) => answer_with(slot, header.unique, 0, len),
                Err(e) => answer_with(slot, header.unique, -e.code(), 0),
            };
        }
    }
    let args = (&slot.header.op_in[..op], &slot.payload[..payload]);
    if wire::answer(door, &header, args.0, args.1, answered) {
        if answered.body.len() > PAYLOAD_LEN {
            return answer_with(slot, header.unique, -libc::ERANGE, 0);
        }
        slot.payload[..answered.body.len()].copy_from_slice(&answered.body);
        return answer_with(slot, header.unique, answered.error, answered.body.len());
    }
    let through = session.ok_or_else(|| io::Error::other("no session here"));
    if let Err(e) = through.and_then(|session| through_session(slot, session, op, payload)) {
        tracing::warn!(
            "FUSE request {} through the session: {e}: answered EIO",
            header.opcode
        );
        answer_with(slot, header.unique, -libc::EIO, 0);
    }
}

/// Puts the out header of an answer of `len` payload bytes (or of `error`)
/// in `slot`.
fn answer_with(slot: &mut Slot, unique: u64, error: i32, len: usize) {
    let out = wire::out_header(unique, error, len);
    slot.header.in_out[..OUT_HEADER_LEN].copy_from_slice(out.as_bytes());
    set_payload_len(slot, len);
}

fn set_payload_len(slot: &mut Slot, len: usize) {
    slot.header.ent.payload_sz = len as u32;
}

/// Hands the request in `slot` (its operation's header `op` bytes long,
/// its payload `payload`) to the fuser session, and puts its answer back.
fn through_session(
    slot: &mut Slot,
    session: &OwnedFd,
    op: usize,
    payload: usize,
) -> io::Result<()> {
    const READDIR: u32 = 28;
    const READDIRPLUS: u32 = 44;
    // A listing fits in one message.
    if matches!(slot.in_header().opcode, READDIR | READDIRPLUS) {
        let op_in = &mut slot.header.op_in[..op];
        if let Some(mut read) = abi::args::<ReadIn>(op_in) {
            read.size = read.size.min(LISTING_MAX);
            read.write_to_prefix(op_in).expect("read from there");
        }
    }
    sendmsg(
        session.as_fd(),
        &[
            IoSlice::new(&slot.header.in_out[..IN_HEADER_LEN]),
            IoSlice::new(&slot.header.op_in[..op]),
            IoSlice::new(&slot.payload[..payload]),
        ],
        &mut SendAncillaryBuffer::default(),
        SendFlags::empty(),
    )?;
    let got = recvmsg(
        session.as_fd(),
        &mut [
            IoSliceMut::new(&mut slot.header.in_out[..OUT_HEADER_LEN]),
            IoSliceMut::new(&mut slot.payload),
        ],
        &mut RecvAncillaryBuffer::default(),
        RecvFlags::empty(),
    )?;
    set_payload_len(slot, got.bytes.saturating_sub(OUT_HEADER_LEN));
    Ok(())
}
