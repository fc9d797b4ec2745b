//! A blocking TCP acceptor that drives one [`Session`] with std::net and a
//! thread per connection.
//!
//! The session is shared by all connections behind a mutex, but only the
//! connection that logged on (the owner) feeds it bytes and ticks; a second
//! connection that tries to log on to a session already in use is closed,
//! as FIX requires. Before a connection owns the session its first message
//! must be a Logon with the configured BeginString and CompIDs, otherwise
//! the connection is closed without a word.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::codec::{self, FrameBuffer};
use crate::dictionary::Dictionary;
use crate::echo::{EchoApplication, RejectingApplication};
use crate::session::{Action, Application, Role, Session, SessionConfig};
use crate::store::{FileStore, STORED_MESSAGES_MAX_DEFAULT};
use crate::tags;
use crate::time::system_now_ms;

/// Everything needed to run an acceptor for one session.
#[derive(Clone, Debug)]
pub struct AcceptorConfig {
    pub listen: SocketAddr,
    /// Our CompID (the peer's TargetCompID).
    pub sender_comp_id: String,
    /// The peer's CompID.
    pub target_comp_id: String,
    /// The session's store lives in `store_dir/<BeginString>-<Sender>-<Target>/`.
    pub store_dir: PathBuf,
    /// A QuickFIX-format data dictionary (e.g. FIX44.xml).
    pub dictionary_path: PathBuf,
    /// Run the echo application of QuickFIX's acceptance-test server;
    /// otherwise application messages are rejected as unsupported.
    pub echo: bool,
    pub begin_string: String,
    /// Reset sequence numbers when a connection drops, as the acceptance
    /// server does; off, a restart resumes the session from the store.
    pub reset_on_disconnect: bool,
    pub latency_max_ms: i64,
    pub message_size_max_bytes: usize,
    pub stored_messages_max: usize,
    pub connections_max: usize,
    /// How often the owner connection lets the session's timers run.
    pub tick_interval_ms: u64,
    /// fsync the store after each write.
    pub store_sync: bool,
    /// Print session events and every message in and out to stderr.
    pub verbose: bool,
    /// A peer that stops reading is dropped after this long.
    pub write_timeout_ms: u64,
}

impl AcceptorConfig {
    pub fn new(
        listen: SocketAddr,
        sender_comp_id: &str,
        target_comp_id: &str,
        store_dir: PathBuf,
        dictionary_path: PathBuf,
    ) -> Self {
        AcceptorConfig {
            listen,
            sender_comp_id: sender_comp_id.to_string(),
            target_comp_id: target_comp_id.to_string(),
            store_dir,
            dictionary_path,
            echo: false,
            begin_string: "FIX.4.4".to_string(),
            reset_on_disconnect: false,
            latency_max_ms: 120_000,
            message_size_max_bytes: codec::MESSAGE_SIZE_MAX_BYTES_DEFAULT,
            stored_messages_max: STORED_MESSAGES_MAX_DEFAULT,
            connections_max: 64,
            tick_interval_ms: 50,
            store_sync: false,
            verbose: false,
            write_timeout_ms: 5_000,
        }
    }
}

struct Slot {
    session: Session,
    app: Box<dyn Application + Send>,
    /// The connection that logged on, if any.
    owner: Option<u64>,
}

// The session holds a boxed store (Send) and an Arc'd dictionary; it is only
// used under the slot's mutex.
struct Shared {
    slot: Mutex<Slot>,
    config: AcceptorConfig,
    shutdown: AtomicBool,
    connections: AtomicUsize,
}

/// A running acceptor started by [`spawn_acceptor`].
pub struct AcceptorHandle {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl AcceptorHandle {
    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, closes connections and waits for the accept loop.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for AcceptorHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

fn build(config: AcceptorConfig) -> io::Result<(TcpListener, Arc<Shared>)> {
    let dictionary = Arc::new(Dictionary::from_file(&config.dictionary_path)?);
    if dictionary.begin_string != config.begin_string {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "dictionary is for {} but the session is {}",
                dictionary.begin_string, config.begin_string
            ),
        ));
    }
    let store_path = config.store_dir.join(format!(
        "{}-{}-{}",
        config.begin_string, config.sender_comp_id, config.target_comp_id
    ));
    let store = FileStore::open(&store_path, config.stored_messages_max, config.store_sync)?;
    let mut session_config = SessionConfig::new(
        &config.begin_string,
        &config.sender_comp_id,
        &config.target_comp_id,
        Role::Acceptor,
    );
    session_config.reset_on_disconnect = config.reset_on_disconnect;
    session_config.latency_max_ms = config.latency_max_ms;
    session_config.message_size_max_bytes = config.message_size_max_bytes;
    let session = Session::new(session_config, dictionary, Box::new(store));
    let app: Box<dyn Application + Send> = if config.echo {
        Box::new(EchoApplication::new())
    } else {
        Box::new(RejectingApplication)
    };
    let listener = TcpListener::bind(config.listen)?;
    listener.set_nonblocking(true)?;
    let shared = Arc::new(Shared {
        slot: Mutex::new(Slot {
            session,
            app,
            owner: None,
        }),
        config,
        shutdown: AtomicBool::new(false),
        connections: AtomicUsize::new(0),
    });
    Ok((listener, shared))
}

/// Runs the acceptor on the calling thread until the process ends.
pub fn run_acceptor(config: AcceptorConfig) -> io::Result<()> {
    let (listener, shared) = build(config)?;
    accept_loop(listener, shared);
    Ok(())
}

/// Starts the acceptor on a background thread and returns once it listens.
pub fn spawn_acceptor(config: AcceptorConfig) -> io::Result<AcceptorHandle> {
    let (listener, shared) = build(config)?;
    let local_addr = listener.local_addr()?;
    let thread_shared = Arc::clone(&shared);
    let thread = std::thread::Builder::new()
        .name("fix-acceptor".into())
        .spawn(move || accept_loop(listener, thread_shared))?;
    Ok(AcceptorHandle {
        local_addr,
        shared,
        thread: Some(thread),
    })
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut next_connection_id: u64 = 1;
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    while !shared.shutdown.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _peer)) => {
                workers.retain(|w| !w.is_finished());
                if shared.connections.load(Ordering::SeqCst) >= shared.config.connections_max {
                    let _ = stream.shutdown(Shutdown::Both);
                    continue;
                }
                let id = next_connection_id;
                next_connection_id += 1;
                shared.connections.fetch_add(1, Ordering::SeqCst);
                let worker_shared = Arc::clone(&shared);
                let spawned = std::thread::Builder::new()
                    .name(format!("fix-conn-{id}"))
                    .spawn(move || {
                        serve_connection(&worker_shared, id, stream);
                        worker_shared.connections.fetch_sub(1, Ordering::SeqCst);
                    });
                match spawned {
                    Ok(worker) => workers.push(worker),
                    Err(_) => {
                        shared.connections.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    for worker in workers {
        let _ = worker.join();
    }
}

/// Whether `frame` is a Logon addressed to this acceptor's session.
fn is_logon_for_us(frame: &[u8], config: &AcceptorConfig) -> bool {
    let Ok(raw) = codec::decode(frame, None, config.message_size_max_bytes) else {
        return false;
    };
    raw.begin_string() == config.begin_string.as_bytes()
        && raw.msg_type() == b"A"
        && raw.get(tags::SENDER_COMP_ID) == Some(config.target_comp_id.as_bytes())
        && raw.get(tags::TARGET_COMP_ID) == Some(config.sender_comp_id.as_bytes())
}

fn serve_connection(shared: &Shared, id: u64, mut stream: TcpStream) {
    let config = &shared.config;
    let tick = Duration::from_millis(config.tick_interval_ms.max(1));
    if stream.set_read_timeout(Some(tick)).is_err() {
        return;
    }
    let _ = stream.set_nodelay(true);
    // Writes happen under the session lock; a peer that stops reading must
    // not stall the session for everyone.
    if stream
        .set_write_timeout(Some(Duration::from_millis(config.write_timeout_ms.max(1))))
        .is_err()
    {
        return;
    }
    let connected_at_ms = system_now_ms();
    let mut pending = FrameBuffer::new(config.message_size_max_bytes);
    let mut owner = false;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if shared.shutdown.load(Ordering::SeqCst) {
            break;
        }
        let read = stream.read(&mut buf);
        let now_ms = system_now_ms();
        let bytes: &[u8] = match &read {
            Ok(0) => break,
            Ok(n) => &buf[..*n],
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                &[]
            }
            Err(_) => break,
        };
        let mut slot = match shared.slot.lock() {
            Ok(slot) => slot,
            Err(poisoned) => poisoned.into_inner(),
        };
        let Slot {
            session,
            app,
            owner: slot_owner,
        } = &mut *slot;
        if !owner {
            if !bytes.is_empty() {
                pending.push(bytes);
            }
            let first = match pending.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => {
                    if now_ms - connected_at_ms > session.config().logon_timeout_ms {
                        break;
                    }
                    continue;
                }
                Err(_) => break,
            };
            if !is_logon_for_us(&first, config) || slot_owner.is_some() {
                break;
            }
            *slot_owner = Some(id);
            owner = true;
            if session.is_connected() {
                // A previous owner vanished without us noticing; start afresh.
                session.on_disconnect(now_ms, app.as_mut());
            }
            session.on_connect(now_ms);
            if config.verbose {
                eprintln!("fix[{id}] <- {}", printable(&first));
            }
            session.on_bytes(now_ms, &first, app.as_mut());
            let rest = pending.take_bytes();
            if !rest.is_empty() {
                session.on_bytes(now_ms, &rest, app.as_mut());
            }
        } else if !bytes.is_empty() {
            if config.verbose {
                eprintln!("fix[{id}] <- {}", printable(bytes));
            }
            session.on_bytes(now_ms, bytes, app.as_mut());
        }
        session.on_tick(now_ms, app.as_mut());
        let mut close = false;
        while let Some(action) = session.poll_action() {
            match action {
                Action::Send(out) => {
                    if config.verbose {
                        eprintln!("fix[{id}] -> {}", printable(&out));
                    }
                    if stream.write_all(&out).is_err() {
                        close = true;
                    }
                }
                Action::Disconnect { .. } => close = true,
            }
        }
        while let Some(event) = session.poll_event() {
            if config.verbose {
                eprintln!("fix[{id}] {event}");
            }
        }
        if close || !session.is_connected() {
            if session.is_connected() {
                session.on_disconnect(now_ms, app.as_mut());
            }
            *slot_owner = None;
            owner = false;
            drop(slot);
            break;
        }
    }
    if owner {
        let mut slot = match shared.slot.lock() {
            Ok(slot) => slot,
            Err(poisoned) => poisoned.into_inner(),
        };
        let Slot {
            session,
            app,
            owner: slot_owner,
        } = &mut *slot;
        if *slot_owner == Some(id) {
            session.on_disconnect(system_now_ms(), app.as_mut());
            *slot_owner = None;
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// Shows SOH as `|` for logs.
fn printable(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).replace('\x01', "|")
}
