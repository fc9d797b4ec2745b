//! A replica group whose nodes each run one loop on one thread (the shape issue 36 weighs
//! against openraft's task per role): the floor of a replication round, for `bench round`.
//!
//! What it keeps of a real node: the client protocol (`Request::Submit` frames answered with
//! `Response::Submitted`), batches as the batcher builds them (what arrived while the last
//! entry was in flight), the journal (an append and an fdatasync per entry on every replica),
//! AppendEntries to both followers sent before the leader's own fsync, a quorum's
//! acknowledgement before an entry commits, the replicated state applied on every replica and
//! the committed stream published on each. What it leaves out: elections, terms, conflicts,
//! snapshots, hash checks, market data, TLS (the leader is fixed at node 1). It is a
//! measuring device, not a node: its figures bound from below what a node built this way
//! would cost, which is the question the issue asks before the node is rebuilt.
//!
//! Peer frames (little endian, length-prefixed like every bourse frame): an append is
//! `[1][first index u64][commit u64][count u32]` then each entry as `[len u32][bytes]` (an
//! empty append only carries the commit index); an acknowledgement is `[2][durable index u64]`.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{anyhow, bail, Context, Result};
use bourse_cluster::batch::{Batch, BatchBuilder, LogCommand, REQUESTS_PER_BATCH_MAX};
use bourse_cluster::net::{
    decode_message, encode_frame_into, Request, Response, SubmitError, Tagged,
};
use bourse_cluster::stream::CommittedStream;
use bourse_cluster::{CommittedEntry, CommittedRequest, Outcome, ReplicatedState};
use bourse_engine::EngineConfig;
use bourse_journal::{Config as JournalConfig, Entry, Fsync, Journal};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

const WAKER: Token = Token(0);
const LISTENER: Token = Token(1);
/// Tokens of the leader's two followers.
const FOLLOWER_FIRST: usize = 2;
/// Tokens of accepted connections (clients at the leader, the leader at a follower) from here.
const ACCEPTED_FIRST: usize = 8;
/// Connections a node accepts at most.
const CONNECTIONS_MAX: usize = 64;
/// Entries a leader keeps sent but not committed (the nodes' `append_in_flight_max` is 4).
const ENTRIES_IN_FLIGHT_MAX: usize = 4;
/// The largest frame either side accepts.
const FRAME_BYTES_MAX: usize = 64 << 20;
const TAG_APPEND: u8 = 1;
const TAG_ACK: u8 = 2;
/// Entries the committed stream ring keeps (the client reads it live).
const STREAM_KEPT_ENTRIES: usize = 4096;

/// A running group: three node threads, node 1 leading.
pub struct LoopGroup {
    pub leader_addr: SocketAddr,
    /// The leader's committed stream.
    pub stream: CommittedStream,
    /// Entries the leader has committed.
    pub entries: Arc<AtomicU64>,
    /// Each node's last applied index, nodes 1, 2, 3.
    applied: Vec<Arc<AtomicU64>>,
    stop: Arc<AtomicBool>,
    wakers: Vec<Arc<Waker>>,
    /// Each node's thread, ending with its last applied index and state hash.
    threads: Vec<JoinHandle<Result<(u64, u64)>>>,
}

impl LoopGroup {
    /// Starts the three nodes on `ports` with journals under `dir`; thread names start with
    /// `bench-node-<id>` as the openraft group's do, so the same CPU accounting reads them.
    pub fn start(
        dir: &std::path::Path,
        ports: [u16; 3],
        fsync: bool,
        engine: EngineConfig,
        checkpoint_every_entries: u64,
    ) -> Result<LoopGroup> {
        let addrs: Vec<SocketAddr> = ports
            .iter()
            .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let entries = Arc::new(AtomicU64::new(0));
        let stream = CommittedStream::new(STREAM_KEPT_ENTRIES, 1);
        let (mut wakers, mut threads, mut applied) = (Vec::new(), Vec::new(), Vec::new());
        // Followers first: the leader dials them.
        for id in [3u64, 2, 1] {
            let mut node = LoopNode::bind(
                id,
                addrs[id as usize - 1],
                dir,
                fsync,
                engine,
                checkpoint_every_entries,
            )?;
            if id == 1 {
                node.dial_followers(&addrs[1..])?;
                node.stream = stream.clone();
                node.committed_entries = entries.clone();
            }
            wakers.push(node.waker.clone());
            applied.push(node.applied.clone());
            let stop = stop.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("bench-node-{id}"))
                    .spawn(move || node.run(&stop))
                    .context("node thread")?,
            );
        }
        applied.reverse();
        Ok(LoopGroup {
            leader_addr: addrs[0],
            stream,
            entries,
            applied,
            stop,
            wakers,
            threads,
        })
    }
}

impl LoopGroup {
    /// Waits (at most `wait_ms`) until every replica applied what the leader applied, stops
    /// the nodes and returns each one's (last applied index, state hash): equal on all three
    /// when the group replicated and applied every entry alike.
    pub fn finish(mut self, wait_ms: u64) -> Result<Vec<(u64, u64)>> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(wait_ms);
        let caught_up = |a: &[Arc<AtomicU64>]| {
            let leader = a[0].load(Ordering::Acquire);
            a.iter().all(|x| x.load(Ordering::Acquire) == leader)
        };
        while !caught_up(&self.applied) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        self.signal_stop();
        let mut ends = Vec::new();
        for t in self.threads.drain(..).rev() {
            ends.push(t.join().map_err(|_| anyhow!("a node loop panicked"))??);
        }
        Ok(ends)
    }

    fn signal_stop(&self) {
        self.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            let _ = w.wake();
        }
    }
}

impl Drop for LoopGroup {
    fn drop(&mut self) {
        self.signal_stop();
        for t in self.threads.drain(..) {
            match t.join() {
                Ok(Err(e)) => eprintln!("bench round: node loop: {e:#}"),
                Err(_) => eprintln!("bench round: a node loop panicked"),
                Ok(Ok(_)) => {}
            }
        }
    }
}

/// A connection with its unread and unwritten bytes.
struct Conn {
    socket: TcpStream,
    token: Token,
    read: Vec<u8>,
    write: Vec<u8>,
    closed: bool,
}

impl Conn {
    fn new(socket: TcpStream, token: Token) -> Conn {
        Conn {
            socket,
            token,
            read: Vec::with_capacity(64 * 1024),
            write: Vec::with_capacity(64 * 1024),
            closed: false,
        }
    }

    /// Reads everything the socket holds.
    fn fill(&mut self) -> Result<()> {
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match self.socket.read(&mut chunk) {
                Ok(0) => {
                    self.closed = true;
                    return Ok(());
                }
                Ok(n) => self.read.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.closed = true;
                    return Ok(());
                }
            }
            if self.read.len() > FRAME_BYTES_MAX * 2 {
                bail!(
                    "connection {:?}: more than {FRAME_BYTES_MAX} bytes unread",
                    self.token
                );
            }
        }
    }

    /// The complete frames read so far, each passed to `f`; the rest stays.
    fn frames(&mut self, mut f: impl FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let mut at = 0;
        while self.read.len() - at >= 4 {
            let len =
                u32::from_le_bytes(self.read[at..at + 4].try_into().expect("4 bytes")) as usize;
            if len > FRAME_BYTES_MAX {
                bail!("frame of {len} bytes");
            }
            if self.read.len() - at - 4 < len {
                break;
            }
            f(&self.read[at + 4..at + 4 + len])?;
            at += 4 + len;
        }
        self.read.drain(..at);
        Ok(())
    }

    /// Writes what waits; what the socket does not take waits for the next pass (the
    /// connection is then also registered for writability).
    fn flush(&mut self, poll: &Poll) -> Result<()> {
        let mut done = 0;
        while done < self.write.len() {
            match self.socket.write(&self.write[done..]) {
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.closed = true;
                    break;
                }
            }
        }
        self.write.drain(..done);
        let interest = if self.write.is_empty() {
            Interest::READABLE
        } else {
            Interest::READABLE | Interest::WRITABLE
        };
        poll.registry()
            .reregister(&mut self.socket, self.token, interest)?;
        Ok(())
    }
}

/// An entry the leader has sent and not yet applied: its batch and whom to answer.
struct Pending {
    index: u64,
    batch: Batch,
    /// (client connection slot, tag), in the batch's request order.
    answer_to: Vec<(usize, u64)>,
}

struct LoopNode {
    id: u64,
    poll: Poll,
    waker: Arc<Waker>,
    listener: TcpListener,
    /// The leader's connections to its followers (empty on a follower).
    followers: Vec<Conn>,
    /// Accepted connections: clients at the leader, the leader at a follower.
    accepted: Vec<Option<Conn>>,
    journal: Journal,
    fsync: bool,
    state: ReplicatedState,
    stream: CommittedStream,
    committed_entries: Arc<AtomicU64>,
    /// The last index applied here.
    applied: Arc<AtomicU64>,
    /// Entries appended here, not yet applied.
    pending: VecDeque<Pending>,
    last_index: u64,
    commit: u64,
    /// The commit index the followers were last sent (leader only).
    sent_commit: u64,
    /// Each follower's durable index (leader only).
    follower_durable: Vec<u64>,
    applied_out: Vec<CommittedRequest>,
}

impl LoopNode {
    fn bind(
        id: u64,
        addr: SocketAddr,
        dir: &std::path::Path,
        fsync: bool,
        engine: EngineConfig,
        checkpoint_every_entries: u64,
    ) -> Result<LoopNode> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let mut listener = TcpListener::bind(addr).with_context(|| format!("bind {addr}"))?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let mut config = JournalConfig::new(0x100b, id);
        // The loop fsyncs itself, after sending, so that the followers' appends overlap it.
        config.fsync = Fsync::Never;
        let (journal, _) = Journal::open(dir.join(format!("loop-node-{id}")), config)
            .map_err(|e| anyhow!("node {id} journal: {e}"))?;
        Ok(LoopNode {
            id,
            poll,
            waker,
            listener,
            followers: Vec::new(),
            accepted: (0..CONNECTIONS_MAX).map(|_| None).collect(),
            journal,
            fsync,
            state: ReplicatedState::new(engine, checkpoint_every_entries),
            stream: CommittedStream::new(STREAM_KEPT_ENTRIES, 1),
            committed_entries: Arc::new(AtomicU64::new(0)),
            applied: Arc::new(AtomicU64::new(0)),
            pending: VecDeque::new(),
            last_index: 0,
            commit: 0,
            sent_commit: 0,
            follower_durable: Vec::new(),
            applied_out: Vec::new(),
        })
    }

    fn dial_followers(&mut self, addrs: &[SocketAddr]) -> Result<()> {
        for (i, addr) in addrs.iter().enumerate() {
            let std_stream = std::net::TcpStream::connect(addr)
                .with_context(|| format!("dial follower at {addr}"))?;
            std_stream.set_nodelay(true)?;
            std_stream.set_nonblocking(true)?;
            let mut socket = TcpStream::from_std(std_stream);
            let token = Token(FOLLOWER_FIRST + i);
            self.poll
                .registry()
                .register(&mut socket, token, Interest::READABLE)?;
            self.followers.push(Conn::new(socket, token));
            self.follower_durable.push(0);
        }
        Ok(())
    }

    fn is_leader(&self) -> bool {
        !self.followers.is_empty()
    }

    fn run(mut self, stop: &AtomicBool) -> Result<(u64, u64)> {
        let mut events = Events::with_capacity(256);
        while !stop.load(Ordering::Acquire) {
            self.poll.poll(&mut events, None)?;
            for event in events.iter() {
                match event.token() {
                    WAKER => {}
                    LISTENER => self.accept()?,
                    Token(t) if (FOLLOWER_FIRST..ACCEPTED_FIRST).contains(&t) => {
                        self.followers[t - FOLLOWER_FIRST].fill()?;
                    }
                    Token(t) => {
                        if let Some(conn) = self.accepted[t - ACCEPTED_FIRST].as_mut() {
                            conn.fill()?;
                        }
                    }
                }
            }
            if self.is_leader() {
                self.lead()?;
            } else {
                self.follow()?;
            }
            self.flush_all()?;
        }
        Ok((
            self.applied.load(Ordering::Acquire),
            self.state.state_hash(),
        ))
    }

    fn accept(&mut self) -> Result<()> {
        loop {
            let (socket, _) = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            socket.set_nodelay(true)?;
            let Some(slot) = self.accepted.iter().position(Option::is_none) else {
                continue; // Full: the connection is dropped.
            };
            let token = Token(ACCEPTED_FIRST + slot);
            let mut conn = Conn::new(socket, token);
            self.poll
                .registry()
                .register(&mut conn.socket, token, Interest::READABLE)?;
            self.accepted[slot] = Some(conn);
        }
    }

    /// One pass of the leader: acknowledgements, then the next entry from what the clients
    /// sent, then the commit.
    fn lead(&mut self) -> Result<()> {
        for (i, f) in self.followers.iter_mut().enumerate() {
            let durable = &mut self.follower_durable[i];
            f.frames(|frame| {
                if frame.len() != 9 || frame[0] != TAG_ACK {
                    bail!("follower sent a frame that is not an acknowledgement");
                }
                *durable = (*durable).max(u64::from_le_bytes(frame[1..9].try_into().expect("8")));
                Ok(())
            })?;
        }
        self.advance_commit()?;
        let sent = if self.pending.len() < ENTRIES_IN_FLIGHT_MAX {
            self.propose()?
        } else {
            false
        };
        if !sent && self.commit > self.sent_commit {
            // No entry carries the new commit index: an empty append does (as raft-rs and
            // openraft send one), so that the followers apply.
            self.send_append(self.last_index + 1, &[])?;
        }
        Ok(())
    }

    fn advance_commit(&mut self) -> Result<()> {
        let mut durable = [
            self.last_index,
            self.follower_durable[0],
            self.follower_durable[1],
        ];
        durable.sort_unstable();
        let quorum = durable[1];
        if quorum > self.commit {
            self.commit = quorum;
            self.apply_committed();
        }
        Ok(())
    }

    /// Applies every entry the commit index covers, answers its requests' clients (a
    /// follower's entries name none) and publishes it on the committed stream.
    fn apply_committed(&mut self) {
        while self.pending.front().is_some_and(|p| p.index <= self.commit) {
            let p = self.pending.pop_front().expect("front");
            self.applied_out.clear();
            self.state
                .apply_batch(&p.batch, p.index, &mut self.applied_out);
            self.state.entry_applied(p.index);
            self.applied.store(p.index, Ordering::Release);
            for (request, (slot, tag)) in self.applied_out.iter().zip(&p.answer_to) {
                if let Some(conn) = self.accepted[*slot].as_mut() {
                    encode_frame_into(
                        &mut conn.write,
                        &Tagged {
                            tag: *tag,
                            body: Response::Submitted(Ok(Outcome::from(request))),
                        },
                    );
                }
            }
            self.stream.publish(CommittedEntry {
                index: p.index,
                requests: std::mem::take(&mut self.applied_out),
                market_data_flush_ns: None,
            });
            self.committed_entries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Builds the next entry from every request the clients sent; appends it, sends it to
    /// both followers, then fsyncs. False when no request waited.
    fn propose(&mut self) -> Result<bool> {
        let mut builder = BatchBuilder::with_capacity(64);
        let mut answer_to = Vec::new();
        for slot in 0..self.accepted.len() {
            let Some(conn) = self.accepted[slot].as_mut() else {
                continue;
            };
            let mut refused = Vec::new();
            conn.frames(|frame| {
                let msg: Tagged<Request> = decode_message(frame)?;
                match msg.body {
                    Request::Submit {
                        client_id,
                        request_seq,
                        command,
                    } if (builder.len() as u32) < REQUESTS_PER_BATCH_MAX => {
                        match builder.push_encoded(client_id, request_seq, &command) {
                            Ok(()) => answer_to.push((slot, msg.tag)),
                            Err(e) => refused.push((msg.tag, format!("{e:?}"))),
                        }
                    }
                    Request::Submit { .. } => refused.push((msg.tag, "batch full".into())),
                    _ => refused.push((msg.tag, "this bench node takes Submit only".into())),
                }
                Ok(())
            })?;
            for (tag, why) in refused {
                encode_frame_into(
                    &mut conn.write,
                    &Tagged {
                        tag,
                        body: Response::Submitted(Err::<Outcome, _>(SubmitError::Invalid(why))),
                    },
                );
            }
            if conn.closed {
                self.accepted[slot] = None;
            }
        }
        if builder.is_empty() {
            return Ok(false);
        }
        let batch = builder.finish();
        let index = self.last_index + 1;
        let payload = LogCommand::Batch(batch.clone()).encode();
        self.journal
            .append(&[Entry {
                index: index - 1,
                term: 1,
                payload: payload.clone(),
            }])
            .map_err(|e| anyhow!("append: {e}"))?;
        self.last_index = index;
        self.send_append(index, &[payload])?;
        self.flush_all()?;
        if self.fsync {
            self.journal.flush().map_err(|e| anyhow!("fsync: {e}"))?;
        }
        self.pending.push_back(Pending {
            index,
            batch,
            answer_to,
        });
        Ok(true)
    }

    fn send_append(&mut self, first_index: u64, entries: &[Vec<u8>]) -> Result<()> {
        for f in &mut self.followers {
            let len = 1 + 8 + 8 + 4 + entries.iter().map(|e| 4 + e.len()).sum::<usize>();
            f.write.extend_from_slice(&(len as u32).to_le_bytes());
            f.write.push(TAG_APPEND);
            f.write.extend_from_slice(&first_index.to_le_bytes());
            f.write.extend_from_slice(&self.commit.to_le_bytes());
            f.write
                .extend_from_slice(&(entries.len() as u32).to_le_bytes());
            for e in entries {
                f.write.extend_from_slice(&(e.len() as u32).to_le_bytes());
                f.write.extend_from_slice(e);
            }
        }
        self.sent_commit = self.commit;
        Ok(())
    }

    /// One pass of a follower: every append read is written, fsynced once, acknowledged, and
    /// what the leader's commit index covers is applied.
    fn follow(&mut self) -> Result<()> {
        let mut appended = Vec::new();
        let mut commit = self.commit;
        for conn in self.accepted.iter_mut().flatten() {
            conn.frames(|frame| {
                let (first, leader_commit, entries) = parse_append(frame)?;
                commit = commit.max(leader_commit);
                for (i, e) in entries.into_iter().enumerate() {
                    appended.push(Entry {
                        index: first + i as u64 - 1,
                        term: 1,
                        payload: e,
                    });
                }
                Ok(())
            })?;
        }
        if !appended.is_empty() {
            // The journal counts from 0, the log from 1.
            if appended[0].index != self.last_index {
                bail!(
                    "node {}: append at {} after {}",
                    self.id,
                    appended[0].index + 1,
                    self.last_index
                );
            }
            self.journal
                .append(&appended)
                .map_err(|e| anyhow!("append: {e}"))?;
            if self.fsync {
                self.journal.flush().map_err(|e| anyhow!("fsync: {e}"))?;
            }
            self.last_index = appended.last().expect("non-empty").index + 1;
            let ack = {
                let mut b = Vec::with_capacity(13);
                b.extend_from_slice(&9u32.to_le_bytes());
                b.push(TAG_ACK);
                b.extend_from_slice(&self.last_index.to_le_bytes());
                b
            };
            for conn in self.accepted.iter_mut().flatten() {
                conn.write.extend_from_slice(&ack);
            }
            for e in appended {
                let LogCommand::Batch(batch) =
                    LogCommand::decode_owned(e.payload).map_err(|e| anyhow!("entry: {e:?}"))?
                else {
                    bail!("not a batch");
                };
                self.pending.push_back(Pending {
                    index: e.index + 1,
                    batch,
                    answer_to: Vec::new(),
                });
            }
        }
        self.commit = commit.min(self.last_index);
        self.apply_committed();
        Ok(())
    }

    fn flush_all(&mut self) -> Result<()> {
        for f in &mut self.followers {
            if !f.write.is_empty() {
                f.flush(&self.poll)?;
            }
        }
        for conn in self.accepted.iter_mut().flatten() {
            if !conn.write.is_empty() {
                conn.flush(&self.poll)?;
            }
        }
        Ok(())
    }
}

/// `(first index, leader commit, entries)` of an append frame.
fn parse_append(frame: &[u8]) -> Result<(u64, u64, Vec<Vec<u8>>)> {
    let bad = || anyhow!("malformed append frame");
    if frame.len() < 21 || frame[0] != TAG_APPEND {
        return Err(bad());
    }
    let first = u64::from_le_bytes(frame[1..9].try_into().expect("8"));
    let commit = u64::from_le_bytes(frame[9..17].try_into().expect("8"));
    let count = u32::from_le_bytes(frame[17..21].try_into().expect("4")) as usize;
    let mut at = 21;
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        let len_bytes = frame.get(at..at + 4).ok_or_else(bad)?;
        let len = u32::from_le_bytes(len_bytes.try_into().expect("4")) as usize;
        entries.push(frame.get(at + 4..at + 4 + len).ok_or_else(bad)?.to_vec());
        at += 4 + len;
    }
    Ok((first, commit, entries))
}
