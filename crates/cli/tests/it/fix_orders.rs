//! A FIX client that sends new orders at a steady pace through a gateway whatever happens to
//! the core behind it, and keeps how each order was answered and when: what a test needs to
//! time a failover as a client sees it and to count what the core applied. Shared by the
//! tests that put a gateway in front of replicated nodes (`use crate::fix_orders`).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bourse_client::{FixClient, FixClientConfig};

/// How the gateway answered an order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An execution report other than a reject (New, or a Trade when it crossed at once):
    /// the core applied it.
    Applied,
    /// Refused by the gateway because the core has no quorum: never sent to the core.
    NoQuorum,
    /// Refused otherwise (the text).
    Refused(String),
}

pub struct Order {
    pub sent_us: u64,
    pub answer: Option<(u64, Outcome)>,
}

/// What one order looks like: the account, whether it buys, the symbol, its quantity in
/// units and its price.
#[derive(Clone, Debug)]
pub struct OrderSpec {
    pub account: u32,
    pub buy: bool,
    pub symbol: &'static str,
    pub qty: i64,
    pub price: &'static str,
}

/// What the client thread and the test share.
pub struct FixOrders {
    epoch: Instant,
    /// Orders by ClOrdID - 1.
    pub orders: Mutex<Vec<Order>>,
    pub sending: AtomicBool,
    pub stop: AtomicBool,
}

impl FixOrders {
    /// `epoch`: the instant the test's other clocks count from, so that times compare.
    pub fn new(epoch: Instant) -> Arc<FixOrders> {
        Arc::new(FixOrders {
            epoch,
            orders: Mutex::new(Vec::new()),
            sending: AtomicBool::new(true),
            stop: AtomicBool::new(false),
        })
    }

    pub fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// The earliest answer matching `want` to an order sent at or after `from_us`.
    pub fn first_answer_after(&self, from_us: u64, want: &dyn Fn(&Outcome) -> bool) -> Option<u64> {
        let orders = self.orders.lock().unwrap();
        let start = orders.partition_point(|o| o.sent_us < from_us);
        orders[start..]
            .iter()
            .filter_map(|o| o.answer.as_ref())
            .filter(|(_, outcome)| want(outcome))
            .map(|(at, _)| *at)
            .min()
    }

    /// The longest time between acknowledgements (answers `Applied`) from `from_us` on,
    /// up to the first one at or after `to_us` (or to `to_us` when none came by then): how
    /// long the client heard nothing but refusals, whichever orders were answered.
    pub fn longest_silence_us(&self, from_us: u64, to_us: u64) -> u64 {
        let mut times: Vec<u64> = self
            .orders
            .lock()
            .unwrap()
            .iter()
            .filter_map(|o| match o.answer {
                Some((at, Outcome::Applied)) if at >= from_us => Some(at),
                _ => None,
            })
            .collect();
        times.sort_unstable();
        let mut previous = from_us;
        let mut longest = 0;
        for t in times {
            longest = longest.max(t - previous);
            previous = t;
            if t >= to_us {
                return longest;
            }
        }
        longest.max(to_us.saturating_sub(previous))
    }

    pub fn all_answered(&self) -> bool {
        self.orders
            .lock()
            .unwrap()
            .iter()
            .all(|o| o.answer.is_some())
    }

    /// Orders the core applied: every order answered but those the gateway refused for no
    /// quorum (a core's own reject is a command in its history too).
    pub fn applied(&self) -> u64 {
        self.orders
            .lock()
            .unwrap()
            .iter()
            .filter(|o| !matches!(o.answer, Some((_, Outcome::NoQuorum)) | None))
            .count() as u64
    }

    pub fn sent(&self) -> usize {
        self.orders.lock().unwrap().len()
    }

    pub fn count(&self, want: &dyn Fn(&Outcome) -> bool) -> usize {
        self.orders
            .lock()
            .unwrap()
            .iter()
            .filter(|o| o.answer.as_ref().is_some_and(|(_, a)| want(a)))
            .count()
    }
}

/// The FIX client: logs on as `session` to the gateway at `fix`, then sends one new order
/// every `pace` while `sending` (order k as `spec(k)`), matching every execution report to its
/// order by ClOrdID, until `stop`.
pub fn fix_client_thread(
    shared: Arc<FixOrders>,
    fix: SocketAddr,
    session: &'static str,
    pace: Duration,
    spec: fn(usize) -> OrderSpec,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut config = FixClientConfig::new(fix, session, "BOURSE");
        config.reset_on_logon = true;
        let mut client = FixClient::connect(&config).expect("FIX logon");
        let mut next = Instant::now();
        while !shared.stop.load(Ordering::SeqCst) {
            if shared.sending.load(Ordering::SeqCst) && Instant::now() >= next {
                let mut orders = shared.orders.lock().unwrap();
                let cl = orders.len() + 1;
                orders.push(Order {
                    sent_us: shared.now_us(),
                    answer: None,
                });
                drop(orders);
                let o = spec(cl - 1);
                client
                    .new_order(
                        &cl.to_string(),
                        Some(o.account),
                        o.symbol,
                        o.buy,
                        o.qty,
                        Some(o.price),
                        '0',
                    )
                    .expect("send an order");
                next = (next + pace).max(Instant::now());
            }
            let wait = next
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            let Some(m) = client.recv(wait).expect("FIX read") else {
                assert!(
                    client.is_logged_on(),
                    "FIX session ended: {:?}",
                    client.closed_reason()
                );
                continue;
            };
            if m.msg_type != "8" {
                continue;
            }
            let Some(cl) = FixClient::field(&m, 11).and_then(|c| c.parse::<usize>().ok()) else {
                continue;
            };
            let outcome = match FixClient::field(&m, 150) {
                Some("8") => {
                    let text = FixClient::field(&m, 58).unwrap_or("").to_string();
                    if text.contains("no quorum") {
                        Outcome::NoQuorum
                    } else {
                        Outcome::Refused(text)
                    }
                }
                Some(_) => Outcome::Applied,
                None => continue,
            };
            let at = shared.now_us();
            let mut orders = shared.orders.lock().unwrap();
            if let Some(o) = orders.get_mut(cl - 1) {
                o.answer.get_or_insert((at, outcome));
            }
        }
    })
}
