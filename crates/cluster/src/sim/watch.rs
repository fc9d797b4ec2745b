//! A watch channel that wakes its waiters in the order they began to wait, for the seeded
//! runtime (`sim::SeededRuntime`).
//!
//! openraft 0.10 wakes its per-follower replication tasks through shared watch channels. tokio's
//! `watch` spreads its waiters over eight slots chosen by tokio's own generator, which is seeded
//! from the operating system, so two waiters woken by one send run in an order that changes from
//! run to run; in the simulation that order decides which AppendEntries leaves first, and so the
//! delays and losses each one draws. [`FifoWatch`] keeps its waiters in one queue and wakes them
//! front to back, so the same program wakes them in the same order every time.
//!
//! Semantics follow tokio's watch where openraft relies on them: a receiver remembers the version
//! it last saw; `changed` returns at once when a newer value was sent, else waits for one, and
//! fails once every sender is gone and nothing new is left to see; `send` fails when no receiver
//! is left, `send_if_modified` stores the value whether or not anyone listens.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::task::{Context, Poll, Waker};

use openraft::async_runtime::watch::{RecvError, SendError, Watch, WatchReceiver, WatchSender};
use openraft::{OptionalSend, OptionalSync};

/// The channel family plugged into openraft's runtime.
pub struct FifoWatch;

/// Who waits, in the order they began to wait, and what version the value is at.
struct Waiters {
    /// Bumped by every send; receivers compare it with the version they last saw.
    version: u64,
    /// Each waiting `changed` call: its ticket and its task's waker, oldest first.
    queue: VecDeque<(u64, Waker)>,
    /// The next ticket to hand out.
    next_ticket: u64,
}

struct Shared<T> {
    value: RwLock<T>,
    waiters: Mutex<Waiters>,
    senders: AtomicUsize,
    receivers: AtomicUsize,
}

impl<T> Shared<T> {
    fn lock_waiters(&self) -> std::sync::MutexGuard<'_, Waiters> {
        // A waker that panicked cannot leave the queue half updated; go on with what is there.
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> RwLockReadGuard<'_, T> {
        self.value.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes every waiter, oldest first, after the version moved or the last sender left.
    fn wake_all(&self, bump: bool) {
        let woken: Vec<Waker> = {
            let mut w = self.lock_waiters();
            if bump {
                w.version += 1;
            }
            w.queue.drain(..).map(|(_, waker)| waker).collect()
        };
        for waker in woken {
            waker.wake();
        }
    }
}

/// The sending half; clones share the channel.
pub struct FifoSender<T> {
    shared: Arc<Shared<T>>,
}

/// The receiving half; a clone starts from the version its original had seen.
pub struct FifoReceiver<T> {
    shared: Arc<Shared<T>>,
    seen: u64,
}

/// A new channel holding `init`; its receiver has seen `init`.
pub fn channel<T>(init: T) -> (FifoSender<T>, FifoReceiver<T>) {
    let shared = Arc::new(Shared {
        value: RwLock::new(init),
        waiters: Mutex::new(Waiters {
            version: 0,
            queue: VecDeque::new(),
            next_ticket: 0,
        }),
        senders: AtomicUsize::new(1),
        receivers: AtomicUsize::new(1),
    });
    (
        FifoSender {
            shared: shared.clone(),
        },
        FifoReceiver { shared, seen: 0 },
    )
}

impl<T> Clone for FifoSender<T> {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::SeqCst);
        FifoSender {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for FifoSender<T> {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::SeqCst) == 1 {
            // The channel is closed: every waiter must learn it.
            self.shared.wake_all(false);
        }
    }
}

impl<T> Clone for FifoReceiver<T> {
    fn clone(&self) -> Self {
        self.shared.receivers.fetch_add(1, Ordering::SeqCst);
        FifoReceiver {
            shared: self.shared.clone(),
            seen: self.seen,
        }
    }
}

impl<T> Drop for FifoReceiver<T> {
    fn drop(&mut self) {
        self.shared.receivers.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<T> FifoSender<T> {
    /// Replaces the value and wakes the waiters; fails (handing the value back) when no
    /// receiver is left, as tokio's does.
    pub fn send(&self, value: T) -> Result<(), T> {
        if self.shared.receivers.load(Ordering::SeqCst) == 0 {
            return Err(value);
        }
        *self.shared.value.write().unwrap_or_else(|e| e.into_inner()) = value;
        self.shared.wake_all(true);
        Ok(())
    }

    /// Lets `modify` change the value in place; wakes the waiters only if it says it did.
    pub fn send_if_modified<F: FnOnce(&mut T) -> bool>(&self, modify: F) -> bool {
        let modified = {
            let mut value = self.shared.value.write().unwrap_or_else(|e| e.into_inner());
            modify(&mut value)
        };
        if modified {
            self.shared.wake_all(true);
        }
        modified
    }

    /// The current value.
    pub fn borrow(&self) -> RwLockReadGuard<'_, T> {
        self.shared.read()
    }

    /// A new receiver that has seen the current value.
    pub fn subscribe(&self) -> FifoReceiver<T> {
        self.shared.receivers.fetch_add(1, Ordering::SeqCst);
        let seen = self.shared.lock_waiters().version;
        FifoReceiver {
            shared: self.shared.clone(),
            seen,
        }
    }
}

impl<T> FifoReceiver<T> {
    /// Waits for a value newer than the one this receiver last saw, and marks it seen; `Err`
    /// once every sender is gone and no newer value is left.
    pub fn changed(&mut self) -> Changed<'_, T> {
        Changed {
            receiver: self,
            ticket: None,
        }
    }

    /// The current value, without marking it seen.
    pub fn borrow(&self) -> RwLockReadGuard<'_, T> {
        self.shared.read()
    }

    /// The current value, marked seen.
    pub fn borrow_and_update(&mut self) -> RwLockReadGuard<'_, T> {
        self.seen = self.shared.lock_waiters().version;
        self.shared.read()
    }
}

/// The future of [`FifoReceiver::changed`]: keeps its place in the queue across polls and
/// leaves it when dropped.
pub struct Changed<'a, T> {
    receiver: &'a mut FifoReceiver<T>,
    ticket: Option<u64>,
}

impl<T> Future for Changed<'_, T> {
    type Output = Result<(), ()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let shared = this.receiver.shared.clone();
        let mut w = shared.lock_waiters();
        if w.version != this.receiver.seen {
            this.receiver.seen = w.version;
            this.ticket = None;
            return Poll::Ready(Ok(()));
        }
        if shared.senders.load(Ordering::SeqCst) == 0 {
            this.ticket = None;
            return Poll::Ready(Err(()));
        }
        match this.ticket {
            // Polled again before a wake: keep the place, refresh the waker.
            Some(t) if w.queue.iter().any(|(q, _)| *q == t) => {
                if let Some(entry) = w.queue.iter_mut().find(|(q, _)| *q == t) {
                    entry.1.clone_from(cx.waker());
                }
            }
            _ => {
                let t = w.next_ticket;
                w.next_ticket += 1;
                w.queue.push_back((t, cx.waker().clone()));
                this.ticket = Some(t);
            }
        }
        Poll::Pending
    }
}

impl<T> Drop for Changed<'_, T> {
    fn drop(&mut self) {
        if let Some(t) = self.ticket {
            self.receiver
                .shared
                .lock_waiters()
                .queue
                .retain(|(q, _)| *q != t);
        }
    }
}

impl Watch for FifoWatch {
    type Sender<T: OptionalSend + OptionalSync> = FifoSender<T>;
    type Receiver<T: OptionalSend + OptionalSync> = FifoReceiver<T>;
    type Ref<'a, T: OptionalSend + 'a> = RwLockReadGuard<'a, T>;

    fn channel<T: OptionalSend + OptionalSync>(init: T) -> (FifoSender<T>, FifoReceiver<T>) {
        channel(init)
    }
}

impl<T: OptionalSend + OptionalSync> WatchSender<FifoWatch, T> for FifoSender<T> {
    fn send(&self, value: T) -> Result<(), SendError<T>> {
        FifoSender::send(self, value).map_err(SendError)
    }

    fn send_if_modified<F>(&self, modify: F) -> bool
    where
        F: FnOnce(&mut T) -> bool,
    {
        FifoSender::send_if_modified(self, modify)
    }

    fn borrow_watched(&self) -> RwLockReadGuard<'_, T> {
        self.borrow()
    }

    fn subscribe(&self) -> FifoReceiver<T> {
        FifoSender::subscribe(self)
    }
}

impl<T: OptionalSend + OptionalSync> WatchReceiver<FifoWatch, T> for FifoReceiver<T> {
    async fn changed(&mut self) -> Result<(), RecvError> {
        FifoReceiver::changed(self).await.map_err(RecvError)
    }

    fn borrow_watched(&self) -> RwLockReadGuard<'_, T> {
        self.borrow()
    }

    fn borrow_and_update(&mut self) -> RwLockReadGuard<'_, T> {
        FifoReceiver::borrow_and_update(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;

    /// Runs `waiters` tasks that each wait for one change on a clone of one receiver, begun in
    /// the order of their number, then sends once; returns the order the tasks ran after it.
    fn wake_order(waiters: usize, use_tokio: bool) -> Vec<usize> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let order = Arc::new(StdMutex::new(Vec::new()));
            let mut tasks = Vec::new();
            if use_tokio {
                let (tx, rx) = tokio::sync::watch::channel(0u64);
                for i in 0..waiters {
                    let (mut rx, order) = (rx.clone(), order.clone());
                    tasks.push(tokio::spawn(async move {
                        rx.changed().await.expect("changed");
                        order.lock().expect("order").push(i);
                    }));
                    // Let the task reach its wait before the next one starts.
                    tokio::task::yield_now().await;
                }
                tx.send(1).expect("send");
            } else {
                let (tx, rx) = channel(0u64);
                for i in 0..waiters {
                    let (mut rx, order) = (rx.clone(), order.clone());
                    tasks.push(tokio::spawn(async move {
                        rx.changed().await.expect("changed");
                        order.lock().expect("order").push(i);
                    }));
                    tokio::task::yield_now().await;
                }
                tx.send(1).expect("send");
            }
            for t in tasks {
                t.await.expect("task");
            }
            let order = order.lock().expect("order").clone();
            order
        })
    }

    #[test]
    fn waiters_wake_in_the_order_they_began_to_wait() {
        let expected: Vec<usize> = (0..32).collect();
        for _ in 0..20 {
            assert_eq!(wake_order(32, false), expected);
        }
    }

    /// The reason this channel exists: tokio's watch wakes the same waiters in an order drawn
    /// from its own generator, so twenty runs do not all see the order they waited in.
    #[test]
    fn tokio_watch_does_not_keep_the_waiting_order() {
        let expected: Vec<usize> = (0..32).collect();
        let in_order = (0..20).filter(|_| wake_order(32, true) == expected).count();
        assert!(
            in_order < 20,
            "tokio's watch woke 32 waiters in order 20 times"
        );
    }

    #[test]
    fn changed_sees_a_value_sent_before_it_waits_and_marks_it_seen() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let (tx, mut rx) = channel(1u32);
            tx.send(2).expect("a receiver is alive");
            rx.changed().await.expect("a newer value");
            assert_eq!(*rx.borrow(), 2);
            // Seen: a second `changed` must wait, and so gives way to the timeout.
            let waited =
                tokio::time::timeout(std::time::Duration::from_millis(1), rx.changed()).await;
            assert!(waited.is_err(), "no newer value was sent");
            let mut late = tx.subscribe();
            assert!(tx.send_if_modified(|v| {
                *v = 3;
                true
            }));
            late.changed().await.expect("a newer value");
            assert_eq!(*late.borrow_and_update(), 3);
        });
    }

    #[test]
    fn changed_fails_once_every_sender_is_gone_and_send_fails_without_receivers() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let (tx, mut rx) = channel(0u8);
            let tx2 = tx.clone();
            let waiting = tokio::spawn(async move { rx.changed().await });
            tokio::task::yield_now().await;
            drop(tx);
            drop(tx2);
            assert_eq!(waiting.await.expect("task"), Err(()));
            let (tx, rx) = channel(0u8);
            drop(rx);
            assert_eq!(tx.send(5), Err(5));
            // `send_if_modified` stores the value even with nobody listening, as tokio's.
            assert!(tx.send_if_modified(|v| {
                *v = 6;
                true
            }));
            assert_eq!(*tx.borrow(), 6);
        });
    }
}
