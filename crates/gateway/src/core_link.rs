//! The core behind the gateway: a minimal trait, and an in-process implementation that runs a
//! state machine (the engine) on its own thread behind bounded queues.

use bourse_core::{Command, Event};
use crossbeam_channel::{bounded, Receiver, Sender, TryRecvError, TrySendError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Identifies one request of one session: the idempotency key of a command. `session` is the
/// gateway's number for the session (0 is the gateway's own administration); `seq` grows by
/// one per command the session submits. A core that sees a key again (a gateway resubmitting
/// after a failover) must not apply the command twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestKey {
    pub session: u32,
    pub seq: u64,
}

/// What the core sends back. Every event carries the key of the command that caused it, and
/// the events of one command are followed by `Done` with that key. Events that concern other
/// sessions (the resting side of a trade, orders removed by another session's mass cancel)
/// come under the key of the command that caused them: the gateway routes them by order id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreOutput {
    Event { key: RequestKey, event: Event },
    Done { key: RequestKey },
}

/// Why a command could not be submitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue to the core is full: the gateway answers "system busy" and the client may
    /// retry. Never blocks, so that one busy core cannot stall every session.
    Full,
    /// The core is gone.
    Closed,
}

/// The core behind a gateway. Implemented here by [`InProcessCore`]; the cluster client (the
/// leader of the core's replica group) implements the same trait.
pub trait CoreLink: Send {
    /// Hands a command to the core without blocking.
    fn submit(&mut self, key: RequestKey, command: Command) -> Result<(), SubmitError>;
    /// The next output, if one is ready; never blocks.
    fn try_recv(&mut self) -> Option<CoreOutput>;
    /// Registers a function the link calls (from any thread) after it made output ready, so
    /// that a gateway sleeping in its event loop wakes up.
    fn set_notify(&mut self, notify: Arc<dyn Fn() + Send + Sync>);
    /// For a core that outlives the gateway (a replica group): the last position in the
    /// core's output stream (a log index) whose outputs [`CoreLink::try_recv`] has handed
    /// over, all of them; before the first, the position the link started after. The gateway
    /// saves it with its order state at stop and resumes from it. `None` for a core that
    /// lives and dies with the gateway ([`InProcessCore`]): nothing of it can be resumed.
    fn stream_position(&self) -> Option<u64> {
        None
    }
}

/// A state machine that applies commands: the engine, or a test double.
pub type ApplyFn = Box<dyn FnMut(&Command, &mut Vec<Event>) + Send>;

type Notify = Arc<Mutex<Option<Arc<dyn Fn() + Send + Sync>>>>;

/// Commands one core thread applies before it notifies the gateway: smart batching, so that
/// a burst costs one wake-up and not one per command.
const BATCH_COMMANDS_MAX: usize = 256;

/// A core on its own thread: commands in through one bounded queue, outputs out through
/// another. The thread ends when the link is dropped.
pub struct InProcessCore {
    commands: Option<Sender<(RequestKey, Command)>>,
    outputs: Receiver<CoreOutput>,
    notify: Notify,
    thread: Option<JoinHandle<()>>,
}

impl InProcessCore {
    /// Starts the core thread. `queue_depth` bounds both queues (in commands and in outputs).
    pub fn spawn(mut apply: ApplyFn, queue_depth: usize) -> InProcessCore {
        assert!(queue_depth > 0);
        let (command_tx, command_rx) = bounded::<(RequestKey, Command)>(queue_depth);
        // Outputs are many per command; give them more room so the core rarely waits.
        let (output_tx, output_rx) = bounded::<CoreOutput>(queue_depth.saturating_mul(8));
        let notify: Notify = Arc::new(Mutex::new(None));
        let notify_core = Arc::clone(&notify);
        let thread = std::thread::Builder::new()
            .name("bourse-core".into())
            .spawn(move || {
                let mut events = Vec::with_capacity(1024);
                // Highest seq applied per session: the idempotency check.
                let mut applied: HashMap<u32, u64> = HashMap::new();
                let wake = |n: &Notify| {
                    let f = n.lock().ok().and_then(|g| g.clone());
                    if let Some(f) = f {
                        f();
                    }
                };
                while let Ok(first) = command_rx.recv() {
                    let mut next = Some(first);
                    let mut done = 0usize;
                    while let Some((key, command)) = next.take() {
                        let fresh = applied.get(&key.session).is_none_or(|&last| key.seq > last);
                        if fresh {
                            applied.insert(key.session, key.seq);
                            events.clear();
                            apply(&command, &mut events);
                            for &event in &events {
                                if matches!(event, Event::OrderLog(_)) {
                                    continue;
                                }
                                if output_tx.send(CoreOutput::Event { key, event }).is_err() {
                                    return;
                                }
                            }
                        }
                        if output_tx.send(CoreOutput::Done { key }).is_err() {
                            return;
                        }
                        done += 1;
                        if done < BATCH_COMMANDS_MAX {
                            next = command_rx.try_recv().ok();
                        }
                    }
                    wake(&notify_core);
                }
            })
            .expect("spawn core thread");
        InProcessCore {
            commands: Some(command_tx),
            outputs: output_rx,
            notify,
            thread: Some(thread),
        }
    }
}

impl InProcessCore {
    /// An engine on its own thread, as core number `core_index` of a venue: it numbers its
    /// orders from `core_index << ORDER_ID_CORE_SHIFT`, so order ids stay unique across cores.
    pub fn engine(
        core_index: usize,
        mut config: bourse_engine::EngineConfig,
        queue_depth: usize,
    ) -> InProcessCore {
        config.first_order_id = ((core_index as u64) << bourse_engine::ORDER_ID_CORE_SHIFT).max(1);
        let mut engine = bourse_engine::Engine::new(config);
        InProcessCore::spawn(
            Box::new(move |c: &Command, out: &mut Vec<Event>| engine.apply(c, out)),
            queue_depth,
        )
    }
}

/// One in-process engine per core of `config` (the links [`crate::spawn_cores`] wants, for a
/// configuration whose cores all run in process), each sized by `engine`.
pub fn engine_links(
    config: &crate::GatewayConfig,
    engine: bourse_engine::EngineConfig,
) -> Vec<Box<dyn CoreLink>> {
    (0..config.core_plan().len())
        .map(|i| {
            Box::new(InProcessCore::engine(
                i,
                engine,
                config.gateway.core_queue_depth,
            )) as Box<dyn CoreLink>
        })
        .collect()
}

impl CoreLink for InProcessCore {
    fn submit(&mut self, key: RequestKey, command: Command) -> Result<(), SubmitError> {
        let Some(tx) = &self.commands else {
            return Err(SubmitError::Closed);
        };
        match tx.try_send((key, command)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(SubmitError::Full),
            Err(TrySendError::Disconnected(_)) => Err(SubmitError::Closed),
        }
    }

    fn try_recv(&mut self) -> Option<CoreOutput> {
        match self.outputs.try_recv() {
            Ok(out) => Some(out),
            Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => None,
        }
    }

    fn set_notify(&mut self, notify: Arc<dyn Fn() + Send + Sync>) {
        if let Ok(mut g) = self.notify.lock() {
            *g = Some(notify);
        }
    }
}

impl Drop for InProcessCore {
    fn drop(&mut self) {
        // Closing the command queue ends the thread's loop; drain outputs so it never waits
        // on a full output queue while we join it.
        self.commands = None;
        if let Some(thread) = self.thread.take() {
            while !thread.is_finished() {
                while self.outputs.try_recv().is_ok() {}
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_core::{CommandBody, RejectReason};

    fn rejecting_core() -> InProcessCore {
        InProcessCore::spawn(
            Box::new(|cmd: &Command, out: &mut Vec<Event>| {
                out.push(Event::CommandRejected {
                    reason: RejectReason::UnknownAccount,
                    ts_ns: cmd.ts_ns,
                })
            }),
            16,
        )
    }

    fn collect(link: &mut InProcessCore, dones: usize) -> Vec<CoreOutput> {
        let mut out = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while out
            .iter()
            .filter(|o| matches!(o, CoreOutput::Done { .. }))
            .count()
            < dones
        {
            assert!(std::time::Instant::now() < deadline, "core did not answer");
            match link.try_recv() {
                Some(o) => out.push(o),
                None => std::thread::yield_now(),
            }
        }
        out
    }

    #[test]
    fn a_resubmitted_key_is_answered_but_not_applied_twice() {
        let mut link = rejecting_core();
        let key = RequestKey { session: 3, seq: 1 };
        let cmd = Command::new(1, CommandBody::EndOfDay);
        link.submit(key, cmd.clone()).unwrap();
        link.submit(key, cmd).unwrap();
        let out = collect(&mut link, 2);
        let events = out
            .iter()
            .filter(|o| matches!(o, CoreOutput::Event { .. }))
            .count();
        assert_eq!(events, 1);
    }

    #[test]
    fn a_full_queue_refuses_without_blocking() {
        let mut link = InProcessCore::spawn(
            Box::new(|_: &Command, _: &mut Vec<Event>| {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }),
            1,
        );
        let mut refused = false;
        for seq in 1..=10 {
            let key = RequestKey { session: 1, seq };
            if link.submit(key, Command::new(1, CommandBody::EndOfDay)) == Err(SubmitError::Full) {
                refused = true;
            }
        }
        assert!(refused);
    }
}
