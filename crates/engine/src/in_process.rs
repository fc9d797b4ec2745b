//! [`InProcessCore`]: a core in the gateway's own process, behind the `CoreLink` seam of
//! `bourse_core::link`: a state machine (the engine, or a test double) on its own thread
//! behind bounded crossbeam queues.
//!
//! It lives beside the engine and not in the gateway so that the gateway knows cores only
//! through the trait (it depends on no engine and no cluster), and not in a crate of its own
//! because it is the engine's one runtime adapter: a thread and two queues around
//! [`crate::Engine::apply`]. The [`crate::Engine`] type itself stays free of threads and I/O;
//! only this module spawns one.

use crate::{Engine, EngineConfig, ORDER_ID_CORE_SHIFT};
use bourse_core::link::{CoreLink, CoreOutput, RequestKey, SubmitError};
use bourse_core::{Command, Event};
use crossbeam_channel::{bounded, Receiver, Sender, TryRecvError, TrySendError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

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
        mut config: EngineConfig,
        queue_depth: usize,
    ) -> InProcessCore {
        config.first_order_id = ((core_index as u64) << ORDER_ID_CORE_SHIFT).max(1);
        let mut engine = Engine::new(config);
        InProcessCore::spawn(
            Box::new(move |c: &Command, out: &mut Vec<Event>| engine.apply(c, out)),
            queue_depth,
        )
    }
}

/// One in-process engine per core, `cores` of them (the links a gateway wants for a
/// configuration whose cores all run in process, in the order of its core plan), each sized
/// by `engine` and each with queues of `queue_depth`.
pub fn engine_links(
    cores: usize,
    engine: EngineConfig,
    queue_depth: usize,
) -> Vec<Box<dyn CoreLink>> {
    (0..cores)
        .map(|i| Box::new(InProcessCore::engine(i, engine, queue_depth)) as Box<dyn CoreLink>)
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
        // The core holds its first command until the test opens the gate, so the queue (one
        // command) is full after at most two submissions whatever the scheduling.
        let (gate, held) = std::sync::mpsc::channel::<()>();
        let mut link = InProcessCore::spawn(
            Box::new(move |_: &Command, _: &mut Vec<Event>| {
                let _ = held.recv();
            }),
            1,
        );
        let mut refused = 0;
        for seq in 1..=10 {
            let key = RequestKey { session: 1, seq };
            if link.submit(key, Command::new(1, CommandBody::EndOfDay)) == Err(SubmitError::Full) {
                refused += 1;
            }
        }
        assert!(refused >= 8, "{refused} of 10 refused");
        drop(gate);
    }
}
