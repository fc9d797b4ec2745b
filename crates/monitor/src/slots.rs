//! Connection slots for a service's listener: at most `connections_max` open in all and at
//! most `per_address_max` from any one peer address, so that one client (or one compromised
//! host) cannot take every slot and keep the others out. A [`Slot`] is held for as long as
//! its connection is open and gives its place back when dropped, however the connection ends.

use crate::metrics::{Counter, Gauge};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Why a connection was given no slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoSlot {
    /// `connections_max` connections are open.
    Full,
    /// `per_address_max` connections from this peer's address are open.
    PerAddress,
}

/// The slots of one listener (or of several listeners that share one budget). Cloning
/// shares the slots.
#[derive(Clone, Debug)]
pub struct ConnectionSlots {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    connections_max: usize,
    per_address_max: usize,
    /// Open connections in all, and per address (an address with none has no entry).
    open: Mutex<(usize, BTreeMap<IpAddr, usize>)>,
    /// Connections open now (exported where the service registered it).
    open_gauge: Gauge,
    /// Connections refused because their address held `per_address_max` already.
    refused_per_address: Counter,
    /// Connections refused because all `connections_max` were taken.
    refused_full: Counter,
    /// Requests per second each connection may make (`None`: no bound of this kind).
    requests_per_s: Option<u32>,
}

impl ConnectionSlots {
    /// Slots with both limits; `open_gauge` follows the connections open. Both limits must
    /// be positive.
    pub fn new(connections_max: usize, per_address_max: usize, open_gauge: Gauge) -> Self {
        let uncounted = (Counter::default(), Counter::default());
        Self::counted(connections_max, per_address_max, open_gauge, uncounted)
    }

    /// [`ConnectionSlots::new`], counting refusals into `(per_address, full)`.
    pub fn counted(
        connections_max: usize,
        per_address_max: usize,
        open_gauge: Gauge,
        (refused_per_address, refused_full): (Counter, Counter),
    ) -> Self {
        assert!(connections_max > 0, "connections_max must be positive");
        assert!(per_address_max > 0, "per_address_max must be positive");
        ConnectionSlots {
            inner: Arc::new(Inner {
                connections_max,
                per_address_max,
                open: Mutex::new((0, BTreeMap::new())),
                open_gauge,
                refused_per_address,
                refused_full,
                requests_per_s: None,
            }),
        }
    }

    /// These slots, each connection allowed at most `requests_per_s` requests a second (in
    /// bursts of up to that many): the server hands each connection a
    /// [`crate::rate::ConnectionRate`] for its handlers to take from.
    pub fn with_requests_per_s(self, requests_per_s: u32) -> Self {
        assert!(requests_per_s > 0, "requests_per_s must be positive");
        let inner = Arc::into_inner(self.inner).expect("set before the slots are shared");
        ConnectionSlots {
            inner: Arc::new(Inner {
                requests_per_s: Some(requests_per_s),
                ..inner
            }),
        }
    }

    /// The bound on each connection's requests per second, if any.
    pub fn requests_per_s(&self) -> Option<u32> {
        self.inner.requests_per_s
    }

    /// A slot for a connection from `peer`, or why there is none (counted).
    pub fn try_take(&self, peer: IpAddr) -> Result<Slot, NoSlot> {
        let mut open = self.inner.open.lock().expect("slots lock");
        if open.0 >= self.inner.connections_max {
            self.inner.refused_full.inc();
            return Err(NoSlot::Full);
        }
        let from_peer = open.1.entry(peer).or_insert(0);
        if *from_peer >= self.inner.per_address_max {
            self.inner.refused_per_address.inc();
            return Err(NoSlot::PerAddress);
        }
        *from_peer += 1;
        open.0 += 1;
        self.inner.open_gauge.add(1);
        Ok(Slot {
            slots: self.clone(),
            peer,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.inner.open.lock().expect("slots lock").0
    }
}

/// One open connection's place; given back when dropped.
#[derive(Debug)]
pub struct Slot {
    slots: ConnectionSlots,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let inner = &self.slots.inner;
        let mut open = inner.open.lock().expect("slots lock");
        open.0 -= 1;
        if let Some(n) = open.1.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.1.remove(&self.peer);
            }
        }
        inner.open_gauge.add(-1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
    }

    #[test]
    fn one_address_cannot_take_more_than_its_share_and_slots_come_back_when_dropped() {
        let gauge = Gauge::default();
        let (per_address, full) = (Counter::default(), Counter::default());
        let counters = (per_address.clone(), full.clone());
        let slots = ConnectionSlots::counted(3, 2, gauge.clone(), counters);
        let a1 = slots.try_take(ip(1)).unwrap();
        let _a2 = slots.try_take(ip(1)).unwrap();
        assert_eq!(slots.try_take(ip(1)).unwrap_err(), NoSlot::PerAddress);
        let _b1 = slots.try_take(ip(2)).unwrap();
        assert_eq!(slots.try_take(ip(3)).unwrap_err(), NoSlot::Full);
        assert_eq!((per_address.get(), full.get(), gauge.get()), (1, 1, 3));
        drop(a1);
        assert_eq!((slots.open(), gauge.get()), (2, 2));
        let _a3 = slots.try_take(ip(1)).unwrap();
        assert_eq!(slots.try_take(ip(2)).unwrap_err(), NoSlot::Full);
    }
}
