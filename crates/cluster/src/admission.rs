//! Admission to the batcher: two lanes, so trading is never queued behind bulk traffic.
//!
//! A node's batcher proposes at most [`BATCHES_IN_FLIGHT_MAX`] batches at once. Before this
//! module it took requests from one queue in arrival order, so an operator adding accounts in
//! bulk (the admin keeps thousands in flight) filled every batch, and a trading command waited
//! for a permit and then for a batch of thousands of additions to commit and apply ahead of it.
//!
//! Now requests are sorted by client when they are queued: a client whose id is at or above
//! [`BULK_CLIENT_ID_MIN`] (the admin's clients) is *bulk*, every other client *trading*. All of
//! one client's requests take one lane, so its commands keep their order (the state machine
//! refuses a gap). The batcher ([`Admission::next_batch`]) serves the trading lane first; bulk
//! batches hold at most [`BULK_BATCHES_IN_FLIGHT_MAX`] of the permits, so the rest are always
//! free for trading, and carry at most [`BULK_REQUESTS_PER_BATCH_MAX`] requests, so a trading
//! batch proposed behind them waits for little work in the log's order. Each lane's queue is
//! bounded ([`PENDING_REQUESTS_MAX`] each); a full lane pushes back on its own connections.

use std::sync::Arc;

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::batch::REQUESTS_PER_BATCH_MAX;

/// Client requests one lane queues for the batcher before it pushes back on connections.
pub const PENDING_REQUESTS_MAX: usize = 65_536;
/// Batches proposed to openraft and not yet answered. More arriving requests wait and form the
/// next, larger batch (smart batching).
pub const BATCHES_IN_FLIGHT_MAX: usize = 4;
/// Of those, the most that may be bulk batches (the others are kept for trading).
pub const BULK_BATCHES_IN_FLIGHT_MAX: usize = 2;
/// The most requests one bulk batch carries (a trading batch carries up to
/// [`REQUESTS_PER_BATCH_MAX`]). Two such batches hold the admin's whole window (4,096), so
/// the addition rate stays as it was; at 512 it fell to 83,000-98,000 accounts/s
/// (BENCHMARKS.md, "Market operations").
pub const BULK_REQUESTS_PER_BATCH_MAX: usize = 2048;
/// Clients with ids from here on are bulk clients (the admin's: `bourse_venue::admin`, and
/// clearing runs'). Gateways (whose links carry a restart epoch in bits 32 to 60 of their id,
/// `bourse_gateway::recovery`), the load generator and the venue's setup (from `1 << 61`) use
/// ids below, so no number of gateway restarts makes a gateway a bulk client or gives it an
/// operator's idempotency keys.
pub const BULK_CLIENT_ID_MIN: u64 = 1 << 62;

/// Whether a client's requests take the bulk lane.
pub fn is_bulk_client(client_id: u64) -> bool {
    client_id >= BULK_CLIENT_ID_MIN
}

/// The sending side: where a connection queues a request for the batcher.
pub struct AdmissionSender<T> {
    trading: mpsc::Sender<T>,
    bulk: mpsc::Sender<T>,
}

/// The batcher's side: the two lanes and the permits of the batches in flight.
pub struct Admission<T> {
    trading: mpsc::Receiver<T>,
    bulk: mpsc::Receiver<T>,
    permits: Arc<Semaphore>,
    bulk_permits: Arc<Semaphore>,
}

/// Held while a batch is in flight; dropping it lets the batcher propose another.
pub struct BatchPermit {
    _any: OwnedSemaphorePermit,
    _bulk: Option<OwnedSemaphorePermit>,
}

/// A new pair of lanes.
pub fn admission<T>() -> (AdmissionSender<T>, Admission<T>) {
    let (trading, trading_rx) = mpsc::channel(PENDING_REQUESTS_MAX);
    let (bulk, bulk_rx) = mpsc::channel(PENDING_REQUESTS_MAX);
    (
        AdmissionSender { trading, bulk },
        Admission {
            trading: trading_rx,
            bulk: bulk_rx,
            permits: Arc::new(Semaphore::new(BATCHES_IN_FLIGHT_MAX)),
            bulk_permits: Arc::new(Semaphore::new(BULK_BATCHES_IN_FLIGHT_MAX)),
        },
    )
}

impl<T> AdmissionSender<T> {
    /// Queues `item` of client `client_id` in its lane, waiting while the lane is full.
    /// Gives the item back when the batcher has stopped.
    pub async fn send(&self, client_id: u64, item: T) -> Result<(), T> {
        let lane = if is_bulk_client(client_id) {
            &self.bulk
        } else {
            &self.trading
        };
        lane.send(item).await.map_err(|e| e.0)
    }

    /// Requests queued in both lanes now.
    pub fn depth(&self) -> usize {
        [&self.trading, &self.bulk]
            .iter()
            .map(|s| s.max_capacity() - s.capacity())
            .sum()
    }
}

impl<T> Admission<T> {
    /// Waits for a free permit and then for requests, and takes what is queued as one batch:
    /// trading requests first (up to [`REQUESTS_PER_BATCH_MAX`]); bulk ones only when no
    /// trading request waits and a bulk permit is free. `None` once every sender is gone.
    pub async fn next_batch(&mut self) -> Option<(Vec<T>, BatchPermit)> {
        let any = self.permits.clone().acquire_owned().await.ok()?;
        let bulk_permits = self.bulk_permits.clone();
        let bulk_rx = &mut self.bulk;
        let bulk_ready = async move {
            let permit = bulk_permits.acquire_owned().await.ok()?;
            let first = bulk_rx.recv().await?;
            Some((permit, first))
        };
        // Biased: a trading request that is queued is taken before any bulk one. A bulk
        // permit taken by the losing branch is given back when its future is dropped, and
        // `recv` loses no message when cancelled.
        let (first, bulk) = tokio::select! {
            biased;
            Some(first) = self.trading.recv() => (first, None),
            Some((permit, first)) = bulk_ready => (first, Some(permit)),
            else => return None,
        };
        let (lane, limit) = match bulk {
            None => (&mut self.trading, REQUESTS_PER_BATCH_MAX as usize),
            Some(_) => (&mut self.bulk, BULK_REQUESTS_PER_BATCH_MAX),
        };
        let mut batch = vec![first];
        while batch.len() < limit {
            match lane.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        Some((
            batch,
            BatchPermit {
                _any: any,
                _bulk: bulk,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRADER: u64 = 7;
    const ADMIN: u64 = BULK_CLIENT_ID_MIN + 1;

    #[tokio::test]
    async fn a_trading_request_is_batched_before_bulk_requests_queued_ahead_of_it() {
        let (tx, mut rx) = admission();
        for i in 0..3 {
            tx.send(ADMIN, ("bulk", i)).await.unwrap();
        }
        tx.send(TRADER, ("trading", 0)).await.unwrap();
        let (first, _p1) = rx.next_batch().await.unwrap();
        assert_eq!(first, vec![("trading", 0)]);
        let (second, _p2) = rx.next_batch().await.unwrap();
        assert_eq!(second, vec![("bulk", 0), ("bulk", 1), ("bulk", 2)]);
    }

    #[tokio::test]
    async fn bulk_batches_never_take_the_permits_kept_for_trading() {
        let (tx, mut rx) = admission();
        let bulk_total = BULK_REQUESTS_PER_BATCH_MAX * (BULK_BATCHES_IN_FLIGHT_MAX + 1);
        for i in 0..bulk_total {
            tx.send(ADMIN, i).await.unwrap();
        }
        let mut held = Vec::new();
        for _ in 0..BULK_BATCHES_IN_FLIGHT_MAX {
            let (batch, permit) = rx.next_batch().await.unwrap();
            assert_eq!(batch.len(), BULK_REQUESTS_PER_BATCH_MAX);
            held.push(permit);
        }
        // Bulk requests still wait, but only trading may take the permits left.
        for i in 0..(BATCHES_IN_FLIGHT_MAX - BULK_BATCHES_IN_FLIGHT_MAX) {
            tx.send(TRADER, usize::MAX - i).await.unwrap();
            let (batch, permit) = rx.next_batch().await.unwrap();
            assert_eq!(batch, vec![usize::MAX - i]);
            held.push(permit);
        }
        // Every permit is held: nothing more is batched until one is given back.
        let blocked = tokio::time::timeout(std::time::Duration::ZERO, rx.next_batch()).await;
        assert!(blocked.is_err(), "a batch was formed past the permits");
        drop(held.remove(0)); // a bulk batch is answered
        let (batch, _p) = rx.next_batch().await.unwrap();
        assert_eq!(batch.len(), BULK_REQUESTS_PER_BATCH_MAX);
        assert_eq!(tx.depth(), 0);
    }

    #[tokio::test]
    async fn one_clients_requests_keep_their_order_across_batches() {
        let (tx, mut rx) = admission();
        let n = BULK_REQUESTS_PER_BATCH_MAX * 2 + 5;
        for seq in 0..n {
            tx.send(ADMIN, seq).await.unwrap();
        }
        let mut seen = Vec::new();
        while seen.len() < n {
            let (batch, _permit) = rx.next_batch().await.unwrap();
            seen.extend(batch);
        }
        assert_eq!(seen, (0..n).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn the_batcher_stops_when_every_sender_is_gone() {
        let (tx, mut rx) = admission::<u32>();
        drop(tx);
        assert!(rx.next_batch().await.is_none());
    }
}
