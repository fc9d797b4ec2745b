//! Shared by the behaviour tests: an engine driven by seeded flow feeding a publisher, a lossy
//! in-process link, and the book comparison against the engine.
#![allow(dead_code)]

use bourse_core::*;
use bourse_engine::workload::{Flow, FlowConfig, Rng};
use bourse_engine::{Engine, EngineConfig};
use bourse_marketdata::{replay, Channel, Feed, Publisher, PublisherConfig, Subscriber, VecSink};

pub const T0_NS: u64 = 1_763_700_000_000_000_000;

/// A core, its order flow and its publisher.
pub struct Harness {
    pub engine: Engine,
    pub flow: Flow,
    pub publisher: Publisher,
    pub now_ns: u64,
    pub events: Vec<Event>,
    pub defs: Vec<Instrument>,
    rng: Rng,
}

pub fn test_publisher_config() -> PublisherConfig {
    PublisherConfig {
        snapshot_cycle_ns: 1_600_000,
        instruments_interval_ns: 20_000_000,
        ..PublisherConfig::default()
    }
}

impl Harness {
    pub fn new(seed: u64, config: PublisherConfig) -> Harness {
        let mut fc = FlowConfig::three_markets(200, seed);
        fc.live_orders_target = 1_500;
        Harness::with_flow(fc, config)
    }

    pub fn with_flow(fc: FlowConfig, config: PublisherConfig) -> Harness {
        let defs = fc.instruments.clone();
        let seed = fc.seed;
        let flow = Flow::new(fc);
        let mut engine = Engine::new(EngineConfig {
            orders_max: 1 << 16,
            instruments_max: 64,
            accounts_max: 10_000,
            levels_per_side_hint: 64,
            first_order_id: 1,
        });
        let mut events = Vec::new();
        let mut now_ns = T0_NS;
        for body in flow.setup() {
            now_ns += 1_000;
            engine.apply(&Command::new(now_ns, body), &mut events);
        }
        events.clear();
        let publisher = Publisher::new(config, &defs);
        Harness {
            engine,
            flow,
            publisher,
            now_ns,
            events,
            defs,
            rng: Rng::new(seed ^ 0xABCD),
        }
    }

    /// Applies up to `commands_max` commands as one committed batch and returns its events.
    pub fn batch(&mut self, commands_max: u64) -> &[Event] {
        self.events.clear();
        let n = 1 + self.rng.below(commands_max);
        for _ in 0..n {
            self.now_ns += 2_000;
            let body = self.flow.next_command();
            let start = self.events.len();
            self.engine
                .apply(&Command::new(self.now_ns, body), &mut self.events);
            self.flow.observe(&self.events[start..]);
        }
        &self.events
    }

    /// One batch published into `sink`, then a publisher tick.
    pub fn step(&mut self, commands_max: u64, sink: &mut VecSink) {
        self.batch(commands_max);
        let events = std::mem::take(&mut self.events);
        self.publisher.publish(&events, self.now_ns, sink);
        self.events = events;
        self.publisher.tick(self.now_ns, sink);
    }
}

/// Drops, reorders and duplicates packets, independently per feed, plus bursts on both.
pub struct LossyLink {
    rng: Rng,
    /// Parts per million of packets dropped, reordered, duplicated.
    pub loss_ppm: u64,
    held: [Vec<(Channel, Vec<u8>)>; 2],
    burst_left: u32,
    /// Chance per delivery call that a burst starts (ppm), and its length in packets.
    pub burst_ppm: u64,
    pub burst_packets: u32,
}

impl LossyLink {
    pub fn new(seed: u64, loss_ppm: u64) -> LossyLink {
        LossyLink {
            rng: Rng::new(seed),
            loss_ppm,
            held: [Vec::new(), Vec::new()],
            burst_left: 0,
            burst_ppm: 0,
            burst_packets: 0,
        }
    }

    fn chance(&mut self, ppm: u64) -> bool {
        ppm > 0 && self.rng.below(1_000_000) < ppm
    }

    /// Delivers `packets` (in publication order) to `sub` on feeds A and B.
    pub fn deliver(&mut self, packets: &[(Channel, Vec<u8>)], sub: &mut Subscriber, now_ns: u64) {
        for (channel, p) in packets {
            if self.burst_left == 0 && self.chance(self.burst_ppm) {
                self.burst_left = self.burst_packets;
            }
            if self.burst_left > 0 {
                // A burst hits both feeds.
                self.burst_left -= 1;
                continue;
            }
            for (k, feed) in [Feed::A, Feed::B].into_iter().enumerate() {
                if self.chance(self.loss_ppm) {
                    continue; // dropped
                }
                if self.chance(self.loss_ppm) {
                    self.held[k].push((*channel, p.clone())); // delivered later
                    continue;
                }
                sub.on_packet(*channel, feed, p, now_ns);
                if self.chance(self.loss_ppm) {
                    sub.on_packet(*channel, feed, p, now_ns); // duplicated
                }
                if !self.held[k].is_empty() && self.rng.below(4) == 0 {
                    for (c, h) in std::mem::take(&mut self.held[k]) {
                        sub.on_packet(c, feed, &h, now_ns);
                    }
                }
            }
        }
    }

    /// Delivers whatever is still held back.
    pub fn release(&mut self, sub: &mut Subscriber, now_ns: u64) {
        for (k, feed) in [Feed::A, Feed::B].into_iter().enumerate() {
            for (c, h) in std::mem::take(&mut self.held[k]) {
                sub.on_packet(c, feed, &h, now_ns);
            }
        }
    }
}

/// Runs the subscriber's recovery requests against the publisher's history, in process.
pub fn serve_recovery(publisher: &Publisher, sub: &mut Subscriber, now_ns: u64) {
    for _ in 0..16 {
        let Some(req) = sub.poll(now_ns) else { return };
        let Some(history) = publisher.history_of(req.channel) else {
            sub.on_replay_done(req.channel, now_ns);
            continue;
        };
        if let Ok(packets) = replay::collect(&history, req.from, req.count) {
            for p in packets {
                sub.on_packet(req.channel, Feed::Replay, &p, now_ns);
            }
        }
        sub.on_replay_done(req.channel, now_ns);
    }
}

/// Ticks the publisher with a moving clock, delivering over `link`, until the subscriber is in
/// step (or the bound is hit). Returns the number of rounds it took.
pub fn settle(h: &mut Harness, sub: &mut Subscriber, link: &mut LossyLink, rounds_max: u32) -> u32 {
    let mut sink = VecSink::default();
    for round in 0..rounds_max {
        h.now_ns += 5_000_000;
        h.publisher.tick(h.now_ns, &mut sink);
        link.deliver(&sink.packets, sub, h.now_ns);
        sink.packets.clear();
        link.release(sub, h.now_ns);
        serve_recovery(&h.publisher, sub, h.now_ns);
        if sub.is_synced()
            && sub.expected(Channel::Orders) == Some(h.publisher.next_seq(Channel::Orders))
        {
            return round;
        }
    }
    rounds_max
}

/// Orders of the engine's book as (id, side, price, visible qty), in priority order.
pub fn engine_orders(engine: &Engine, id: InstrumentId) -> Vec<(u64, Side, i64, i64)> {
    engine
        .resting_orders(id)
        .iter()
        .map(|o| (o.order_id.0, o.side, o.price.0, o.qty_display.0))
        .collect()
}

pub fn subscriber_orders(sub: &Subscriber, id: u32) -> Vec<(u64, Side, i64, i64)> {
    sub.book(id)
        .map(|b| {
            b.orders()
                .map(|o| (o.order_id, o.side, o.price, o.qty))
                .collect()
        })
        .unwrap_or_default()
}

/// Every instrument's order-level book and top 20 equal the engine's.
pub fn assert_books_equal(engine: &Engine, sub: &Subscriber, defs: &[Instrument]) {
    for def in defs {
        let id = def.instrument;
        let inst = sub
            .instrument(id.0)
            .unwrap_or_else(|| panic!("subscriber does not know {id}"));
        assert!(inst.live, "book of {id} is not live");
        assert_eq!(
            subscriber_orders(sub, id.0),
            engine_orders(engine, id),
            "order-level book of {id}"
        );
        for side in [Side::Buy, Side::Sell] {
            let want: Vec<(i64, i64, u32)> = engine
                .depth(id, side, 20)
                .iter()
                .map(|&(p, q, n)| (p.0, q.0, n))
                .collect();
            let got: Vec<(i64, i64, u32)> = inst
                .book
                .levels(side)
                .take(20)
                .map(|l| (l.price, l.qty, l.orders))
                .collect();
            assert_eq!(got, want, "top 20 of {id} {side:?}");
        }
    }
}
