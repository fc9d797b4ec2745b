//! [`StreamConsumer`]: the one way a downstream service reads the committed stream (market
//! data now; data delivery and clearing next), in the node's process or over TCP.
//!
//! A consumer starts at a position (a log index) and hands out every entry from there, in
//! log order, each exactly once: [`StreamConsumer::next`] returns an [`EntryView`] whose
//! requests ([`RequestView`]: key, outcome kind) decode their events only when asked
//! ([`RequestView::events`] walks the encoded bytes, no `Vec<Event>` per request).
//! [`StreamConsumer::position`] is the index of the next entry it will hand out; a consumer
//! that saves it after processing an entry resumes from it later with no gap and no
//! duplicate, whether the consumer restarted, or the node it read from failed (a remote
//! consumer moves to the next node and asks for the same position: every replica applies the
//! same entries at the same indices).
//!
//! A consumer that falls too far behind the live stream is cut off by its node
//! ([`StreamError::Lagged`]); it then catches up by itself, from the node's ring of recent
//! entries or, further back, from the node's stream archive on disk (`archive`), and goes
//! live again. It counts each cut-off and keeps the last reason ([`ConsumerStatus`]). An error
//! from `next` means the consumer cannot continue without a gap: its position is older than
//! anything kept ([`StreamError::TooOld`]), a node installed a snapshot across it
//! ([`StreamError::Gap`]), or no node answered ([`StreamError::Unreachable`]).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bourse_core::codec::{DecodeError, Reader};
use bourse_core::Event;

use crate::archive::{StreamArchive, READ_ENTRIES_MAX};
use crate::client::StreamClient;
use crate::state::OutcomeKind;
use crate::stream::{CommittedEntry, CommittedRequest, CommittedStream, StreamError, Subscription};

/// How long a remote consumer keeps trying the nodes, without receiving anything, before it
/// gives up with [`StreamError::Unreachable`].
pub const RECONNECT_TIMEOUT_MS_DEFAULT: u64 = 15_000;
/// How long an in-process consumer behind the ring waits for the archive's writer to write
/// the entry at its position before it gives up with [`StreamError::TooOld`].
const ARCHIVE_WAIT_MS_MAX: u64 = 5_000;
/// The pause between two connection attempts once every node failed in turn.
const RECONNECT_PAUSE_MS: u64 = 50;

/// One committed entry, shared (cloning it copies a pointer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryView(Arc<CommittedEntry>);

impl EntryView {
    pub fn new(entry: Arc<CommittedEntry>) -> EntryView {
        EntryView(entry)
    }

    /// The entry's log index.
    pub fn index(&self) -> u64 {
        self.0.index
    }

    /// The requests of a batch entry in log order; none for blank, membership and hash-check
    /// entries.
    pub fn requests(&self) -> impl ExactSizeIterator<Item = RequestView<'_>> {
        self.0.requests.iter().map(RequestView)
    }

    /// The time of a market data idle flush entry (see `crate::marketdata`); `None` for
    /// every other entry.
    pub fn market_data_flush_ns(&self) -> Option<u64> {
        self.0.market_data_flush_ns
    }

    /// The entry as stored (for a service that forwards it whole).
    pub fn entry(&self) -> &CommittedEntry {
        &self.0
    }
}

/// One request of a committed entry.
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'a>(&'a CommittedRequest);

impl<'a> RequestView<'a> {
    pub fn new(request: &'a CommittedRequest) -> RequestView<'a> {
        RequestView(request)
    }

    /// The idempotency key: (client id, request seq).
    pub fn key(&self) -> (u64, u64) {
        (self.0.client_id, self.0.request_seq)
    }

    pub fn kind(&self) -> OutcomeKind {
        self.0.kind
    }

    /// The command's effects happened in this entry: its events are new. A `Duplicate`
    /// carries the events of the first application again, for the client's answer; a
    /// consumer that acts on effects (a feed, clearing) takes only applied requests.
    pub fn applied_here(&self) -> bool {
        self.0.kind == OutcomeKind::Applied
    }

    /// Who asked, for a request with an audit trailer (admin actions).
    pub fn audit(&self) -> Option<&'a crate::batch::Audit> {
        self.0.audit.as_ref()
    }

    /// The encoded events.
    pub fn event_bytes(&self) -> &'a [u8] {
        &self.0.events
    }

    /// The events, decoded one by one as the iterator advances.
    pub fn events(&self) -> Events<'a> {
        Events::new(&self.0.events)
    }
}

/// The events of one request, decoded on demand from their encoding (`events.rs`). A damaged
/// list yields one error and then ends.
pub struct Events<'a> {
    reader: Reader<'a>,
    left: u32,
    failed: bool,
}

impl<'a> Events<'a> {
    pub fn new(bytes: &'a [u8]) -> Events<'a> {
        let mut reader = Reader::new(bytes);
        // An empty byte string is an empty list (a request that was not applied).
        let (left, failed) = if bytes.is_empty() {
            (0, false)
        } else {
            match reader.u32() {
                Ok(n) => (n, false),
                Err(_) => (1, true),
            }
        };
        Events {
            reader,
            left,
            failed,
        }
    }
}

impl Iterator for Events<'_> {
    type Item = Result<Event, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            self.failed = false;
            self.left = 0;
            return Some(Err(self.reader.error("event list too short for its count")));
        }
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let r = bourse_core::codec::decode_event(&mut self.reader).and_then(|e| {
            if self.left == 0 {
                self.reader.expect_end()?;
            }
            Ok(e)
        });
        if r.is_err() {
            self.left = 0;
        }
        Some(r)
    }
}

/// What a consumer went through.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumerStatus {
    /// The index of the next entry `next` hands out.
    pub position: u64,
    /// Times the consumer was cut off (it lagged, or its connection failed) and resumed.
    pub cut_offs: u64,
    /// Why it was last cut off.
    pub last_cut_off: Option<String>,
    /// Entries read from a stream archive on disk (in process) while catching up.
    pub entries_from_disk: u64,
    /// Frames from a node that were not the entry expected (damaged, out of order); each
    /// made the consumer drop that connection.
    pub wire_errors: u64,
}

enum Source {
    Local {
        stream: CommittedStream,
        archive: Option<StreamArchive>,
        live: Option<Subscription>,
    },
    Remote {
        nodes: Vec<SocketAddr>,
        current: usize,
        link: Option<StreamClient>,
        /// Nodes that answered TooOld since the last entry received.
        too_old: Vec<StreamError>,
        reconnect_timeout_ms: u64,
        /// A node that sends nothing for this long is left for the next one (none: wait).
        stall_timeout_ms: Option<u64>,
        /// Since when no entry came (while reconnecting).
        failing_since: Option<Instant>,
    },
}

/// Committed entries from a position on, each once and in order (see the module
/// documentation).
pub struct StreamConsumer {
    source: Source,
    pending: VecDeque<Arc<CommittedEntry>>,
    status: ConsumerStatus,
    /// Since when the archive has not yet had the entry at the position.
    archive_wait: Option<Instant>,
}

impl StreamConsumer {
    /// A consumer in the node's process: its committed stream and, if the node keeps one,
    /// its stream archive. It subscribes at once, so an entry applied after this call is
    /// never missed.
    pub fn local(
        stream: CommittedStream,
        archive: Option<StreamArchive>,
        position: u64,
    ) -> StreamConsumer {
        let live = stream.subscribe(position).ok();
        StreamConsumer {
            source: Source::Local {
                stream,
                archive,
                live,
            },
            pending: VecDeque::new(),
            archive_wait: None,
            status: ConsumerStatus {
                position,
                ..ConsumerStatus::default()
            },
        }
    }

    /// A consumer over TCP that reads from the first of `nodes` that answers, and from
    /// another one when that one fails.
    pub fn remote(nodes: Vec<SocketAddr>, position: u64) -> StreamConsumer {
        StreamConsumer {
            source: Source::Remote {
                nodes,
                current: 0,
                link: None,
                too_old: Vec::new(),
                reconnect_timeout_ms: RECONNECT_TIMEOUT_MS_DEFAULT,
                stall_timeout_ms: None,
                failing_since: None,
            },
            pending: VecDeque::new(),
            archive_wait: None,
            status: ConsumerStatus {
                position,
                ..ConsumerStatus::default()
            },
        }
    }

    /// Changes how long a remote consumer tries before it gives up (no effect in process).
    pub fn set_reconnect_timeout_ms(&mut self, timeout_ms: u64) {
        if let Source::Remote {
            reconnect_timeout_ms,
            ..
        } = &mut self.source
        {
            *reconnect_timeout_ms = timeout_ms;
        }
    }

    /// Makes a remote consumer leave a node that sends nothing for `timeout_ms` while
    /// connected, for the next one. For a consumer that knows the entry it waits for exists
    /// (a stopped or partitioned node keeps its connections open and silent); a consumer of
    /// a stream that may simply be idle leaves it unset (the default: wait).
    pub fn set_stall_timeout_ms(&mut self, timeout_ms: u64) {
        if let Source::Remote {
            stall_timeout_ms, ..
        } = &mut self.source
        {
            *stall_timeout_ms = Some(timeout_ms);
        }
    }

    /// Makes a remote consumer read from `addr` from its next entry on, if it reads from
    /// another of its nodes now. For a reader that learned that `addr` already holds the
    /// entry it waits for (the node that answered its request applied that entry before it
    /// answered), while the node it reads from may be paused or cut off: a silent node
    /// would otherwise cost the whole stall timeout. No effect in process, for a node not
    /// among its nodes, or while entries already read wait to be handed out.
    pub fn read_from(&mut self, addr: SocketAddr) {
        if !self.pending.is_empty() {
            return;
        }
        if let Source::Remote {
            nodes,
            current,
            link,
            ..
        } = &mut self.source
        {
            let Some(index) = nodes.iter().position(|&n| n == addr) else {
                return;
            };
            let reading_it = match link {
                Some(l) => l.node == addr,
                None => *current == index,
            };
            if !reading_it {
                *current = index;
                *link = None;
            }
        }
    }

    /// The index of the next entry [`StreamConsumer::next`] hands out: save it after
    /// processing an entry to resume from there.
    pub fn position(&self) -> u64 {
        self.status.position
    }

    pub fn status(&self) -> ConsumerStatus {
        self.status.clone()
    }

    /// The remote node being read from (`None` in process or while reconnecting).
    pub fn node(&self) -> Option<SocketAddr> {
        match &self.source {
            Source::Remote { link, .. } => link.as_ref().map(|l| l.node),
            Source::Local { .. } => None,
        }
    }

    /// The next entry, waiting for it. An error means the consumer cannot go on without a
    /// gap (see the module documentation); calling again tries again.
    pub async fn next(&mut self) -> Result<EntryView, StreamError> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                if let Some(view) = self.accept(e) {
                    return Ok(view);
                }
                continue;
            }
            let e = match &mut self.source {
                Source::Local { .. } => self.next_local().await?,
                Source::Remote { .. } => self.next_remote().await?,
            };
            if let Some(e) = e {
                self.pending.push_back(e);
            }
        }
    }

    /// Hands `e` out if it is the entry at the position; entries before it are skipped (a
    /// resubscription may start earlier); an entry after it cannot happen here (the sources
    /// check it) and is dropped.
    fn accept(&mut self, e: Arc<CommittedEntry>) -> Option<EntryView> {
        if e.index != self.status.position {
            return None;
        }
        self.status.position += 1;
        Some(EntryView(e))
    }

    fn cut_off(&mut self, why: String) {
        crate::net::debug_line(format_args!(
            "stream consumer at entry {}: {why}",
            self.status.position
        ));
        self.status.cut_offs += 1;
        self.status.last_cut_off = Some(why);
    }

    /// The next entry in process: live, or from the ring, or from disk when the position is
    /// older than the ring. `Ok(None)`: try again.
    async fn next_local(&mut self) -> Result<Option<Arc<CommittedEntry>>, StreamError> {
        let position = self.status.position;
        let Source::Local {
            stream,
            archive,
            live,
        } = &mut self.source
        else {
            unreachable!("a local source")
        };
        let Some(sub) = live.as_mut() else {
            match stream.subscribe(position) {
                Ok(s) => *live = Some(s),
                Err(StreamError::TooOld { oldest_kept, .. }) => {
                    let Some(archive) = archive.as_ref() else {
                        return Err(StreamError::TooOld {
                            from_index: position,
                            oldest_kept,
                        });
                    };
                    let entries = archive.read(position, READ_ENTRIES_MAX)?;
                    if entries.is_empty() {
                        // The archive's writer has not written it yet (it still holds it in
                        // its own subscription), or it restarted past it, which the next
                        // read reports as TooOld. Wait for one or the other, a while.
                        let since = *self.archive_wait.get_or_insert_with(Instant::now);
                        if since.elapsed() > Duration::from_millis(ARCHIVE_WAIT_MS_MAX) {
                            self.archive_wait = None;
                            return Err(StreamError::TooOld {
                                from_index: position,
                                oldest_kept,
                            });
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        return Ok(None);
                    }
                    self.archive_wait = None;
                    self.status.entries_from_disk += entries.len() as u64;
                    self.pending.extend(entries);
                }
                Err(e) => return Err(e),
            }
            return Ok(None);
        };
        match sub.recv().await {
            Ok(e) => Ok(Some(e)),
            Err(e @ StreamError::Lagged { .. }) => {
                *live = None;
                self.cut_off(e.to_string());
                Ok(None)
            }
            Err(e) => {
                *live = None;
                Err(e)
            }
        }
    }

    /// The next entry over TCP: from the current node, else from the next one that
    /// answers. `Ok(None)`: try again.
    async fn next_remote(&mut self) -> Result<Option<Arc<CommittedEntry>>, StreamError> {
        let position = self.status.position;
        let Source::Remote {
            nodes,
            current,
            link,
            too_old,
            reconnect_timeout_ms,
            stall_timeout_ms,
            failing_since,
        } = &mut self.source
        else {
            unreachable!("a remote source")
        };
        if nodes.is_empty() {
            return Err(StreamError::Unreachable("no node to read from".into()));
        }
        let since = *failing_since.get_or_insert_with(Instant::now);
        if since.elapsed() > Duration::from_millis(*reconnect_timeout_ms) {
            *failing_since = None;
            return Err(StreamError::Unreachable(format!(
                "no node sent entry {position} for {reconnect_timeout_ms} ms"
            )));
        }
        let Some(client) = link.as_mut() else {
            match StreamClient::connect(nodes[*current], position).await {
                Ok(c) => *link = Some(c),
                Err(_) => {
                    *current = (*current + 1) % nodes.len();
                    if *current == 0 {
                        tokio::time::sleep(Duration::from_millis(RECONNECT_PAUSE_MS)).await;
                    }
                }
            }
            return Ok(None);
        };
        let node = client.node;
        let got = match *stall_timeout_ms {
            None => client.recv().await,
            // Cut off mid-frame by the timeout, the connection is dropped below.
            Some(ms) => tokio::time::timeout(Duration::from_millis(ms), client.recv())
                .await
                .unwrap_or_else(|_| {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("sent nothing for {ms} ms"),
                    ))
                }),
        };
        let failed = |why: String, link: &mut Option<StreamClient>, current: &mut usize| {
            *link = None;
            *current = (*current + 1) % nodes.len();
            why
        };
        match got {
            Ok(Ok(entry)) if entry.index == position => {
                *failing_since = None;
                too_old.clear();
                Ok(Some(Arc::new(entry)))
            }
            Ok(Ok(entry)) => {
                let why = failed(
                    format!(
                        "node {node} sent entry {} where {position} was due",
                        entry.index
                    ),
                    link,
                    current,
                );
                self.status.wire_errors += 1;
                self.cut_off(why);
                Ok(None)
            }
            Ok(Err(e @ StreamError::TooOld { .. })) => {
                too_old.push(e.clone());
                let all = too_old.len() >= nodes.len();
                let why = failed(format!("node {node}: {e}"), link, current);
                if all {
                    too_old.clear();
                    *failing_since = None;
                    return Err(e);
                }
                self.cut_off(why);
                Ok(None)
            }
            Ok(Err(e)) => {
                let why = failed(format!("node {node}: {e}"), link, current);
                self.cut_off(why);
                Ok(None)
            }
            Err(e) => {
                if e.kind() == std::io::ErrorKind::InvalidData {
                    self.status.wire_errors += 1;
                }
                let why = failed(format!("node {node}: {e}"), link, current);
                self.cut_off(why);
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64) -> CommittedEntry {
        let events = vec![
            Event::EndOfDayDone {
                orders_expired: index,
                ts_ns: index,
            };
            2
        ];
        CommittedEntry {
            index,
            requests: vec![CommittedRequest {
                client_id: 1,
                request_seq: index,
                kind: OutcomeKind::Applied,
                applied_index: index,
                events: bourse_core::codec::encode_events(&events),
                audit: None,
            }],
            market_data_flush_ns: None,
        }
    }

    #[test]
    fn events_decode_lazily_and_a_damaged_list_ends_in_one_error() {
        let e = entry(3);
        let r = RequestView::new(&e.requests[0]);
        assert_eq!(r.key(), (1, 3));
        let events: Vec<Event> = r.events().map(|e| e.unwrap()).collect();
        assert_eq!(
            events,
            bourse_core::codec::decode_events(r.event_bytes()).unwrap()
        );
        assert_eq!(Events::new(&[]).count(), 0);
        let bytes = r.event_bytes();
        for cut in 1..bytes.len() {
            let got: Vec<_> = Events::new(&bytes[..cut]).collect();
            assert!(got.last().is_some_and(|e| e.is_err()), "cut at {cut}");
            assert_eq!(got.iter().filter(|e| e.is_err()).count(), 1);
        }
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert!(Events::new(&longer).any(|e| e.is_err()));
    }

    #[tokio::test]
    async fn a_cut_off_consumer_catches_up_from_disk_with_no_gap_and_no_duplicate() {
        let dir = tempfile::tempdir().unwrap();
        let archive = StreamArchive::open(dir.path(), 1, 1, 1 << 20).unwrap();
        let stream = CommittedStream::new(64, 0);
        let mut consumer = StreamConsumer::local(stream.clone(), Some(archive.clone()), 0);
        // Far more entries than the live lag bound and the ring: the consumer is cut off.
        let total = crate::stream::STREAM_SUBSCRIBER_LAG_ENTRIES as u64 + 500;
        let mut batch = Vec::new();
        for i in 0..total {
            let e = entry(i);
            batch.push(Arc::new(e.clone()));
            stream.publish(e);
        }
        archive.append(&batch).unwrap();
        for i in 0..total {
            let view = consumer.next().await.unwrap();
            assert_eq!(view.index(), i);
            assert_eq!(view.entry(), &entry(i));
        }
        let s = consumer.status();
        assert_eq!(s.position, total);
        assert_eq!(s.cut_offs, 1, "{s:?}");
        assert!(s.last_cut_off.unwrap().contains("behind"));
        assert!(s.entries_from_disk >= total - 64, "{}", s.entries_from_disk);
        // Live again: the next entry comes from the stream.
        stream.publish(entry(total));
        assert_eq!(consumer.next().await.unwrap().index(), total);
        // A consumer restarted from a saved position resumes there; one older than both the
        // ring and the archive is refused with what is kept.
        let mut again = StreamConsumer::local(stream.clone(), Some(archive.clone()), 100);
        assert_eq!(again.next().await.unwrap().index(), 100);
        archive.restart_at(total + 1).unwrap();
        let mut lost = StreamConsumer::local(stream.clone(), Some(archive), 5);
        assert!(matches!(
            lost.next().await,
            Err(StreamError::TooOld { from_index: 5, .. })
        ));
        let mut no_disk = StreamConsumer::local(stream, None, 5);
        assert!(matches!(
            no_disk.next().await,
            Err(StreamError::TooOld { from_index: 5, .. })
        ));
    }
}
