//! # bourse-admission: who gets a connection, for every listener of the venue
//!
//! [`Admission`] is one listener's table of open connections and the one admission policy of
//! the venue's doors (order entry, the admin API, delivery's fronts, the market data replay
//! service, the nodes' ports, the dashboard and `/metrics`, clearing's HTTP and FIX). It does
//! no I/O and reads no clock: the caller accepts, passes `now_ms` in and closes what the table
//! names. A connection is a *stranger* until it proves itself (logs on, or sends a whole first
//! request); strangers are bounded in all and per address and must prove themselves within
//! `stranger_timeout_ms`; a newcomer that finds no room displaces the stranger that has waited
//! longest rather than being turned away, so idle or trickling sockets cannot keep out a client
//! that speaks at once. Connections from [`Limits::registered`] networks (the firms' own) have
//! `registered_reserved` places strangers from elsewhere cannot take and are never displaced by
//! them. Every refusal is counted by [`Refusal`].

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// A network in CIDR notation (`10.1.0.0/16`, `192.0.2.7/32`, `2001:db8::/32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    base: IpAddr,
    prefix_bits: u8,
}

impl Cidr {
    /// Whether `ip` lies in this network (an IPv4 address never lies in an IPv6 network).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.base, ip) {
            (IpAddr::V4(b), IpAddr::V4(a)) => {
                let shift = 32 - u32::from(self.prefix_bits);
                u64::from(u32::from(b)) >> shift == u64::from(u32::from(a)) >> shift
            }
            (IpAddr::V6(b), IpAddr::V6(a)) => {
                let shift = 128 - u32::from(self.prefix_bits);
                u128::from(b).checked_shr(shift).unwrap_or(0)
                    == u128::from(a).checked_shr(shift).unwrap_or(0)
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;

    /// `ADDRESS/BITS`, or a bare address (a network of one).
    fn from_str(s: &str) -> Result<Cidr, String> {
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let base: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not a network (expected e.g. 10.1.0.0/16)"))?;
        let max = if base.is_ipv4() { 32 } else { 128 };
        let prefix_bits = match bits {
            None => max,
            Some(b) => match b.trim().parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("{s:?}: the prefix must be 0..={max} bits")),
            },
        };
        Ok(Cidr { base, prefix_bits })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix_bits)
    }
}

/// One listener's limits (each listener's configuration holds them under its own names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, proven or not.
    pub connections_max: usize,
    /// Connections from one address open at once, proven or not.
    pub connections_per_address_max: usize,
    /// Strangers (not yet proven) open at once.
    pub strangers_max: usize,
    /// Strangers from one address open at once; a newcomer from an address holding its share
    /// displaces that address's longest-waiting stranger.
    pub strangers_per_address_max: usize,
    /// A stranger that has not proven itself within this long is closed.
    pub stranger_timeout_ms: u64,
    /// The firms' registered networks: their connections are never displaced by strangers from
    /// elsewhere.
    pub registered: Vec<Cidr>,
    /// Places out of `connections_max` that only connections from `registered` networks may
    /// take (one per session bound to such a network is the usual choice).
    pub registered_reserved: usize,
}

impl Limits {
    /// Limits with one bound for connections and strangers alike, `per_address_max` per
    /// address, and no registered networks.
    pub fn new(connections_max: usize, per_address_max: usize, stranger_timeout_ms: u64) -> Self {
        Limits {
            connections_max,
            connections_per_address_max: connections_max,
            strangers_max: connections_max,
            strangers_per_address_max: per_address_max,
            stranger_timeout_ms,
            registered: Vec::new(),
            registered_reserved: 0,
        }
    }

    /// Checks that every bound is positive and that the reserve leaves room for others;
    /// `listener` names the configuration section in the error.
    pub fn validate(&self, listener: &str) -> Result<(), String> {
        let positive = [
            ("connections_max", self.connections_max as u64),
            (
                "connections_per_address_max",
                self.connections_per_address_max as u64,
            ),
            ("strangers_max", self.strangers_max as u64),
            (
                "strangers_per_address_max",
                self.strangers_per_address_max as u64,
            ),
            ("stranger_timeout_ms", self.stranger_timeout_ms),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("{listener}: {name} must be positive"));
            }
        }
        if self.registered_reserved >= self.connections_max {
            return Err(format!(
                "{listener}: the {} places reserved for registered networks leave none of the \
                 {} connections for anyone else",
                self.registered_reserved, self.connections_max
            ));
        }
        Ok(())
    }
}

/// Why a connection was refused or closed by the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Refusal {
    /// A newcomer closed at once: every connection it could displace has proven itself.
    Full,
    /// A newcomer closed at once: its address holds `connections_per_address_max`, every one
    /// proven.
    AddressFull,
    /// A stranger closed to make room for a newer connection: it had waited longest.
    Displaced,
    /// A stranger closed because a newer one from its own address came while the address held
    /// its share of strangers.
    AddressShare,
    /// A stranger that did not prove itself within `stranger_timeout_ms`.
    Timeout,
}

impl Refusal {
    pub const ALL: [Refusal; 5] = [
        Refusal::Full,
        Refusal::AddressFull,
        Refusal::Displaced,
        Refusal::AddressShare,
        Refusal::Timeout,
    ];

    /// The reason's name in logs and in the `reason` label of `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Full => "full",
            Refusal::AddressFull => "address_full",
            Refusal::Displaced => "displaced",
            Refusal::AddressShare => "address_share",
            Refusal::Timeout => "timeout",
        }
    }

    /// A sentence for a log line.
    pub fn describe(self) -> &'static str {
        match self {
            Refusal::Full => "every connection is taken and each has proven itself",
            Refusal::AddressFull => "its address holds all the connections one address may",
            Refusal::Displaced => "the longest-waiting stranger, to make room for a newer one",
            Refusal::AddressShare => {
                "the longest-waiting stranger of an address that came again past its share"
            }
            Refusal::Timeout => "it did not authenticate or send a whole request in time",
        }
    }
}

/// A connection let in: its id (ids grow with each admission) and the stranger it displaced,
/// which the caller must close now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admit {
    pub id: u64,
    pub displaced: Option<(u64, Refusal)>,
}

#[derive(Clone, Copy, Debug)]
struct Conn {
    ip: IpAddr,
    registered: bool,
    /// Since when it waits to prove itself (`None`: proven, never displaced).
    waiting_since_ms: Option<u64>,
    /// It proved itself once (an HTTP connection kept alive between requests).
    spoke: bool,
}

/// One listener's open connections and the policy that admits them (see the crate overview).
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    open: HashMap<u64, Conn>,
    /// Strangers by (since when they wait, id): the first waited longest.
    waiting: BTreeSet<(u64, u64)>,
    /// Open connections and strangers per address (an address with none has no entry).
    per_address: HashMap<IpAddr, (usize, usize)>,
    /// Connections from registered networks open now, and of them strangers.
    registered_open: usize,
    registered_waiting: usize,
    next_id: u64,
    refusals: [u64; Refusal::ALL.len()],
}

impl Admission {
    /// The table of a listener with `limits` (validated by the caller's configuration).
    pub fn new(limits: Limits) -> Admission {
        assert!(
            limits.validate("admission").is_ok(),
            "admission limits: {:?}",
            limits.validate("admission")
        );
        Admission {
            limits,
            open: HashMap::new(),
            waiting: BTreeSet::new(),
            per_address: HashMap::new(),
            registered_open: 0,
            registered_waiting: 0,
            next_id: 0,
            refusals: [0; Refusal::ALL.len()],
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Whether `ip` lies in one of the registered networks.
    pub fn is_registered(&self, ip: IpAddr) -> bool {
        self.limits.registered.iter().any(|c| c.contains(ip))
    }

    /// Lets in a connection from `ip` accepted at `now_ms`, displacing a stranger if there is
    /// no room; refuses it (counted) when no stranger may be displaced for it.
    pub fn admit(&mut self, ip: IpAddr, now_ms: u64) -> Result<Admit, Refusal> {
        let registered = self.is_registered(ip);
        let (from_ip, strangers_from_ip) = self.per_address.get(&ip).copied().unwrap_or((0, 0));
        let mut displaced = None;
        if from_ip >= self.limits.connections_per_address_max
            || strangers_from_ip >= self.limits.strangers_per_address_max
        {
            // The address gives up its own longest-waiting stranger, or has none to give.
            let Some(victim) = self.longest_waiting(|c| c.ip == ip) else {
                return Err(self.refuse(Refusal::AddressFull));
            };
            displaced = Some((victim, Refusal::AddressShare));
        } else if !self.has_room(registered) {
            // A registered newcomer may displace any stranger from elsewhere, then its own
            // network's; a stranger from elsewhere only another from elsewhere.
            let victim = self.longest_waiting(|c| !c.registered).or_else(|| {
                registered
                    .then(|| self.longest_waiting(|c| c.ip == ip))
                    .flatten()
            });
            let Some(victim) = victim else {
                return Err(self.refuse(Refusal::Full));
            };
            displaced = Some((victim, Refusal::Displaced));
        }
        if let Some((victim, why)) = displaced {
            self.remove(victim);
            self.refusals[why as usize] += 1;
        }
        let id = self.next_id;
        self.next_id += 1;
        let conn = Conn {
            ip,
            registered,
            waiting_since_ms: Some(now_ms),
            spoke: false,
        };
        self.open.insert(id, conn);
        self.waiting.insert((now_ms, id));
        let counts = self.per_address.entry(ip).or_insert((0, 0));
        counts.0 += 1;
        counts.1 += 1;
        if registered {
            self.registered_open += 1;
            self.registered_waiting += 1;
        }
        Ok(Admit { id, displaced })
    }

    /// Whether a newcomer fits without displacing anyone: below every bound, and a stranger
    /// from elsewhere outside the places the registered networks have not filled.
    fn has_room(&self, registered: bool) -> bool {
        if self.open.len() >= self.limits.connections_max {
            return false;
        }
        let strangers_elsewhere = self.waiting.len() - self.registered_waiting;
        if registered {
            return self.waiting.len()
                < self.limits.strangers_max + self.limits.registered_reserved;
        }
        let unfilled = self
            .limits
            .registered_reserved
            .saturating_sub(self.registered_open);
        strangers_elsewhere < self.limits.strangers_max
            && self.open.len() + unfilled < self.limits.connections_max
    }

    /// The stranger `pick` accepts that has waited longest, among those that never proved
    /// themselves first: a client's connection kept alive between its requests goes only when
    /// no stranger that never spoke is left.
    fn longest_waiting(&self, pick: impl Fn(&Conn) -> bool) -> Option<u64> {
        let find = |spoke: bool| {
            self.waiting.iter().map(|&(_, id)| id).find(|id| {
                self.open
                    .get(id)
                    .is_some_and(|c| c.spoke == spoke && pick(c))
            })
        };
        find(false).or_else(|| find(true))
    }

    fn refuse(&mut self, why: Refusal) -> Refusal {
        self.refusals[why as usize] += 1;
        why
    }

    /// `id` authenticated or sent a whole request: it is no stranger and is never displaced.
    pub fn proven(&mut self, id: u64) {
        let Some(conn) = self.open.get_mut(&id) else {
            return;
        };
        conn.spoke = true;
        if let Some(since) = conn.waiting_since_ms.take() {
            self.waiting.remove(&(since, id));
            if let Some(counts) = self.per_address.get_mut(&conn.ip) {
                counts.1 -= 1;
            }
            if conn.registered {
                self.registered_waiting -= 1;
            }
        }
    }

    /// `id` finished its request and waits for the next (an HTTP connection kept alive): a
    /// stranger again from `now_ms`, displaceable and with a deadline.
    pub fn waiting(&mut self, id: u64, now_ms: u64) {
        let Some(conn) = self.open.get_mut(&id) else {
            return;
        };
        if conn.waiting_since_ms.is_none() {
            conn.waiting_since_ms = Some(now_ms);
            self.waiting.insert((now_ms, id));
            if let Some(counts) = self.per_address.get_mut(&conn.ip) {
                counts.1 += 1;
            }
            if conn.registered {
                self.registered_waiting += 1;
            }
        }
    }

    /// Forgets `id` (it closed, or the caller closed it); a no-op for an id already gone.
    pub fn remove(&mut self, id: u64) {
        let Some(conn) = self.open.remove(&id) else {
            return;
        };
        let stranger = match conn.waiting_since_ms {
            Some(since) => {
                self.waiting.remove(&(since, id));
                1
            }
            None => 0,
        };
        if let Some(counts) = self.per_address.get_mut(&conn.ip) {
            counts.0 -= 1;
            counts.1 -= stranger;
            if counts.0 == 0 {
                self.per_address.remove(&conn.ip);
            }
        }
        if conn.registered {
            self.registered_open -= 1;
            self.registered_waiting -= stranger;
        }
    }

    /// The strangers past their deadline at `now_ms`, forgotten and counted as
    /// [`Refusal::Timeout`]: the caller closes them.
    pub fn expire(&mut self, now_ms: u64) -> Vec<u64> {
        let timeout = self.limits.stranger_timeout_ms;
        let late: Vec<u64> = self
            .waiting
            .iter()
            .take_while(|(since, _)| now_ms.saturating_sub(*since) >= timeout)
            .map(|&(_, id)| id)
            .collect();
        for &id in &late {
            self.remove(id);
            self.refusals[Refusal::Timeout as usize] += 1;
        }
        late
    }

    /// When the next stranger's deadline falls, if any stranger waits.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.waiting
            .first()
            .map(|(since, _)| since + self.limits.stranger_timeout_ms)
    }

    /// When `id` must have proven itself, if it is open and still a stranger.
    pub fn deadline_ms(&self, id: u64) -> Option<u64> {
        let since = self.open.get(&id)?.waiting_since_ms?;
        Some(since + self.limits.stranger_timeout_ms)
    }

    /// Whether `id` is open and still a stranger.
    pub fn is_stranger(&self, id: u64) -> bool {
        self.open
            .get(&id)
            .is_some_and(|c| c.waiting_since_ms.is_some())
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.len()
    }

    /// Strangers open now.
    pub fn strangers(&self) -> usize {
        self.waiting.len()
    }

    /// How many connections were refused or closed for `why` so far.
    pub fn refused(&self, why: Refusal) -> u64 {
        self.refusals[why as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
    }

    fn limits(connections_max: usize, strangers_max: usize, per_address: usize) -> Limits {
        Limits {
            strangers_max,
            ..Limits::new(connections_max, per_address, 1_000)
        }
    }

    #[test]
    fn a_newcomer_displaces_the_longest_waiting_stranger_and_never_a_proven_one() {
        let mut a = Admission::new(limits(3, 3, 3));
        let first = a.admit(ip(1), 0).unwrap().id;
        let second = a.admit(ip(2), 1).unwrap().id;
        let third = a.admit(ip(3), 2).unwrap().id;
        a.proven(first);
        let fourth = a.admit(ip(4), 3).unwrap();
        assert_eq!(fourth.displaced, Some((second, Refusal::Displaced)));
        a.proven(third);
        a.proven(fourth.id);
        assert_eq!(a.admit(ip(5), 4), Err(Refusal::Full));
        assert_eq!(a.refused(Refusal::Full), 1);
        assert_eq!(a.refused(Refusal::Displaced), 1);
        assert_eq!((a.open(), a.strangers()), (3, 0));
    }

    #[test]
    fn a_connection_kept_alive_goes_only_after_every_stranger_that_never_spoke() {
        let mut a = Admission::new(limits(2, 2, 2));
        let kept = a.admit(ip(1), 0).unwrap().id;
        a.proven(kept);
        a.waiting(kept, 1);
        let silent = a.admit(ip(1), 2).unwrap().id;
        let newcomer = a.admit(ip(1), 3).unwrap();
        assert_eq!(newcomer.displaced, Some((silent, Refusal::AddressShare)));
        assert!(a.is_stranger(kept));
    }

    #[test]
    fn an_address_past_its_share_gives_up_its_own_stranger_not_another_s() {
        let mut a = Admission::new(limits(10, 10, 2));
        let other = a.admit(ip(9), 0).unwrap().id;
        let mine = a.admit(ip(1), 1).unwrap().id;
        a.admit(ip(1), 2).unwrap();
        let third = a.admit(ip(1), 3).unwrap();
        assert_eq!(third.displaced, Some((mine, Refusal::AddressShare)));
        assert!(a.is_stranger(other));
    }

    #[test]
    fn strangers_past_their_deadline_expire_oldest_first_and_proven_ones_stay() {
        let mut a = Admission::new(limits(10, 10, 10));
        let old = a.admit(ip(1), 0).unwrap().id;
        let proven = a.admit(ip(1), 0).unwrap().id;
        let young = a.admit(ip(2), 500).unwrap().id;
        a.proven(proven);
        assert_eq!(a.next_deadline_ms(), Some(1_000));
        assert_eq!(a.expire(1_000), vec![old]);
        assert_eq!(a.next_deadline_ms(), Some(1_500));
        a.waiting(proven, 1_200);
        assert_eq!(a.expire(2_200), vec![young, proven]);
        assert_eq!((a.open(), a.refused(Refusal::Timeout)), (0, 3));
    }

    #[test]
    fn strangers_from_elsewhere_never_take_a_registered_network_s_places() {
        let l = Limits {
            registered: vec!["127.0.0.200/30".parse().unwrap()],
            registered_reserved: 2,
            ..limits(6, 6, 6)
        };
        let mut a = Admission::new(l);
        for n in 0..4 {
            a.admit(ip(10 + n), u64::from(n)).unwrap();
        }
        // The fifth stranger from elsewhere displaces the first: two places stay reserved.
        let fifth = a.admit(ip(20), 10).unwrap();
        assert_eq!(fifth.displaced.map(|d| d.1), Some(Refusal::Displaced));
        let firm = a.admit(ip(201), 11).unwrap();
        assert_eq!(firm.displaced, None);
        let firm2 = a.admit(ip(202), 12).unwrap();
        assert_eq!(firm2.displaced, None);
        // Full now: strangers from elsewhere displace each other, never the firm's.
        for n in 0..20 {
            let d = a.admit(ip(30 + n), 20 + u64::from(n)).unwrap().displaced;
            assert!(d.is_some_and(|(v, _)| v != firm.id && v != firm2.id));
        }
        assert!(a.is_stranger(firm.id) && a.is_stranger(firm2.id));
        // A newcomer from the firm's network displaces a stranger from elsewhere.
        let firm3 = a.admit(ip(203), 50).unwrap();
        assert!(firm3
            .displaced
            .is_some_and(|(v, _)| v != firm.id && v != firm2.id));
    }

    #[test]
    fn a_network_is_parsed_and_matched_by_its_prefix() {
        let c: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(c.contains("10.1.255.3".parse().unwrap()));
        assert!(!c.contains("10.2.0.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("192.0.2.1".parse().unwrap()));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains("2001:db8::7".parse().unwrap()));
        assert_eq!(
            "127.0.0.1".parse::<Cidr>().unwrap().to_string(),
            "127.0.0.1/32"
        );
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("ten/8".parse::<Cidr>().is_err());
    }

    #[test]
    fn limits_name_the_listener_and_the_setting_that_is_wrong() {
        let e = Limits::new(0, 1, 1).validate("[admin]").unwrap_err();
        assert!(
            e.contains("[admin]") && e.contains("connections_max"),
            "{e}"
        );
        let l = Limits {
            registered_reserved: 4,
            ..Limits::new(4, 1, 1)
        };
        assert!(l.validate("gateway").unwrap_err().contains("reserved"));
    }
}
