//! Cross-process stage derivation: where an order's time goes when its stages are stamped in
//! different processes whose clocks cannot be compared.
//!
//! LTP's method: a process that sees a request arrive and leave (t1, t6) measures its
//! residence T1,6; the process around it measures the round trip T0,7; the two network legs
//! are taken as equal, T0,1 = T6,7 = (T0,7 − T1,6) / 2 ([`crate::probe::ltp_network_leg_ns`]).
//! Applied twice, once between the client and the gateway and once between the gateway and
//! the replica node, it splits a client's round trip into the parts the load-test report shows:
//!
//! | part | from | how |
//! |---|---|---|
//! | network | client ↔ gateway, both ways | client round trip − gateway door to door (t0→t7) |
//! | gateway | decode, route, encode, write | gateway t0→t2 + t6→t7 |
//! | ipc | gateway ↔ node, both ways | gateway t2→t6 − node residence |
//! | replication | batching, append, quorum | node t2→t4 (t3→t4 when t2 is not stamped) |
//! | matching | the trading core | node t4→t5 |
//!
//! The inputs are latency distributions ([`Percentiles`]) aggregated in each process, not
//! per-order pairs, so the split is exact for means (a mean of differences is the difference
//! of means) and an approximation for percentiles (the p99 of a difference is not the
//! difference of p99s); [`Breakdown`] says so in `exact_for`. Shares are of the mean.
//!
//! [`percentiles_from_exposition`] reads the inputs from a `/metrics` page, so a load
//! generator can scrape a gateway and a node and print the table.

use crate::probe::Percentiles;
use serde::Serialize;

/// What a gateway measured (its stage legs, in its own clock).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct GatewayStages {
    /// t0 → t7: socket read to socket write.
    pub door_to_door: Option<Percentiles>,
    /// t0 → t1: decode and validate.
    pub decode: Option<Percentiles>,
    /// t1 → t2: route and hand to the core's link.
    pub route: Option<Percentiles>,
    /// t2 → t6: handed to the core until the response is encoded (the core's round trip).
    pub core_round_trip: Option<Percentiles>,
    /// t6 → t7: encoded to written.
    pub respond: Option<Percentiles>,
}

/// What a replica node measured (kind `entry` legs, in its own clock).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct NodeStages {
    /// t2 → t3: handed to the batcher until appended locally (`None`: not stamped).
    pub to_append: Option<Percentiles>,
    /// t3 → t4: appended locally until committed on a quorum.
    pub commit: Option<Percentiles>,
    /// t4 → t5: committed until applied by the trading core.
    pub apply: Option<Percentiles>,
}

/// One part of the breakdown, in nanoseconds.
#[derive(Clone, Debug, Serialize)]
pub struct BreakdownRow {
    pub part: &'static str,
    pub what: &'static str,
    pub mean_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// Share of the sum of the rows' means, 0..=1.
    pub share: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Breakdown {
    pub rows: Vec<BreakdownRow>,
    pub total_mean_ns: u64,
    /// Which figures are exact: always "mean"; percentiles are differences of percentiles.
    pub exact_for: &'static str,
    /// What the table could not separate, in words (missing inputs).
    pub notes: Vec<String>,
}

#[derive(Clone, Copy, Default)]
struct Figures {
    mean: u64,
    p50: u64,
    p99: u64,
}

impl Figures {
    fn of(p: &Percentiles) -> Figures {
        Figures {
            mean: p.mean,
            p50: p.p50,
            p99: p.p99,
        }
    }
    fn plus(self, o: Figures) -> Figures {
        Figures {
            mean: self.mean + o.mean,
            p50: self.p50 + o.p50,
            p99: self.p99 + o.p99,
        }
    }
    fn minus(self, o: Figures) -> Figures {
        Figures {
            mean: self.mean.saturating_sub(o.mean),
            p50: self.p50.saturating_sub(o.p50),
            p99: self.p99.saturating_sub(o.p99),
        }
    }
}

fn sum(parts: &[Option<Percentiles>]) -> Option<Figures> {
    parts
        .iter()
        .map(|p| p.as_ref().map(Figures::of))
        .try_fold(Figures::default(), |acc, f| f.map(|f| acc.plus(f)))
}

/// Splits the client's round trip (if the client measured one) into network, gateway, IPC,
/// replication and matching, from the gateway's and the node's own measurements.
pub fn derive(
    client_round_trip: Option<&Percentiles>,
    gateway: &GatewayStages,
    node: &NodeStages,
) -> Breakdown {
    let mut notes = Vec::new();
    let mut rows: Vec<(&'static str, &'static str, Figures)> = Vec::new();
    let matching = node.apply.as_ref().map(Figures::of);
    let replication = match (&node.to_append, &node.commit) {
        (Some(a), Some(c)) => Some(Figures::of(a).plus(Figures::of(c))),
        (None, Some(c)) => {
            notes.push(
                "the node does not stamp t2 (handed to its batcher): the time from arrival to \
                 local append is counted in ipc"
                    .to_string(),
            );
            Some(Figures::of(c))
        }
        _ => None,
    };
    let residence = match (replication, matching) {
        (Some(r), Some(m)) => Some(r.plus(m)),
        _ => {
            notes.push("no node stage figures: ipc includes the node's whole residence".into());
            None
        }
    };
    let core_rt = gateway.core_round_trip.as_ref().map(Figures::of);
    let door = gateway.door_to_door.as_ref().map(Figures::of).or_else(|| {
        sum(&[
            gateway.decode,
            gateway.route,
            gateway.core_round_trip,
            gateway.respond,
        ])
    });
    if let (Some(rt), Some(door)) = (client_round_trip, door) {
        rows.push((
            "network",
            "client <-> gateway, both ways: client round trip - gateway t0..t7",
            Figures::of(rt).minus(door),
        ));
    } else if client_round_trip.is_none() {
        notes.push("no client round trip: network to the gateway not derived".into());
    }
    match (door, core_rt) {
        (Some(door), Some(core)) => rows.push((
            "gateway",
            "decode, route, encode, write: gateway t0..t2 + t6..t7",
            door.minus(core),
        )),
        _ => notes.push("no gateway figures: gateway and ipc not derived".into()),
    }
    if let Some(core) = core_rt {
        rows.push((
            "ipc",
            "gateway <-> node, both ways: gateway t2..t6 - node residence",
            match residence {
                Some(r) => core.minus(r),
                None => core,
            },
        ));
    }
    if let Some(r) = replication {
        rows.push(("replication", "batch, append, quorum: node t2..t4", r));
    }
    if let Some(m) = matching {
        rows.push(("matching", "trading core: node t4..t5", m));
    }
    let total: u64 = rows.iter().map(|r| r.2.mean).sum();
    Breakdown {
        rows: rows
            .into_iter()
            .map(|(part, what, f)| BreakdownRow {
                part,
                what,
                mean_ns: f.mean,
                p50_ns: f.p50,
                p99_ns: f.p99,
                share: if total == 0 {
                    0.0
                } else {
                    f.mean as f64 / total as f64
                },
            })
            .collect(),
        total_mean_ns: total,
        exact_for: "mean",
        notes,
    }
}

/// Percentiles of a Prometheus histogram given as cumulative counts at `bounds_ns` (then the
/// total count), with `histogram_quantile`'s linear interpolation inside a bucket; the max is
/// the upper bound of the highest non-empty bucket (the last bound when it is `+Inf`).
pub fn percentiles_from_buckets(
    bounds_ns: &[u64],
    cumulative: &[u64],
    sum_ns: u64,
    count: u64,
) -> Option<Percentiles> {
    if count == 0 || bounds_ns.len() != cumulative.len() {
        return None;
    }
    let q = |quantile: f64| -> u64 {
        let rank = quantile * count as f64;
        let mut lower_bound = 0u64;
        let mut lower_count = 0u64;
        for (b, c) in bounds_ns.iter().zip(cumulative) {
            if (*c as f64) >= rank && *c > lower_count {
                let within = (rank - lower_count as f64) / (*c - lower_count) as f64;
                return lower_bound + ((*b - lower_bound) as f64 * within.clamp(0.0, 1.0)) as u64;
            }
            lower_bound = *b;
            lower_count = *c;
        }
        // In the +Inf bucket: the largest finite bound is all that is known.
        bounds_ns.last().copied().unwrap_or(0)
    };
    let max = bounds_ns
        .iter()
        .zip(cumulative)
        .find(|(_, c)| **c >= count)
        .map(|(b, _)| *b)
        .unwrap_or_else(|| bounds_ns.last().copied().unwrap_or(0));
    Some(Percentiles {
        count,
        mean: sum_ns / count,
        p50: q(0.50),
        p90: q(0.90),
        p99: q(0.99),
        p999: q(0.999),
        p9999: q(0.9999),
        max,
    })
}

/// Reads one histogram family from a Prometheus text exposition, summing every series whose
/// labels include all of `labels` (e.g. `[("stage", "committed"), ("kind", "entry")]`).
pub fn percentiles_from_exposition(
    text: &str,
    family: &str,
    labels: &[(&str, &str)],
) -> Option<Percentiles> {
    let matches = |label_text: &str| {
        labels
            .iter()
            .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")))
    };
    let bucket_prefix = format!("{family}_bucket{{");
    let mut buckets: Vec<(u64, u64)> = Vec::new();
    let (mut sum_ns, mut count) = (0u64, 0u64);
    for line in text.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        if let Some(rest) = series.strip_prefix(&bucket_prefix) {
            if !matches(rest) {
                continue;
            }
            let Some(le) = rest.split("le=\"").nth(1).and_then(|s| s.split('"').next()) else {
                continue;
            };
            if le == "+Inf" {
                continue;
            }
            let (Some(bound), Ok(n)) = (seconds_to_ns(le), value.parse::<f64>()) else {
                continue;
            };
            match buckets.iter_mut().find(|(b, _)| *b == bound) {
                Some(e) => e.1 += n as u64,
                None => buckets.push((bound, n as u64)),
            }
        } else if let Some(rest) = series.strip_prefix(&format!("{family}_sum")) {
            if matches(rest) {
                sum_ns += value.parse::<f64>().map_or(0, |s| (s * 1e9).round() as u64);
            }
        } else if let Some(rest) = series.strip_prefix(&format!("{family}_count")) {
            if matches(rest) {
                count += value.parse::<f64>().map_or(0, |c| c as u64);
            }
        }
    }
    buckets.sort_unstable();
    let (bounds, cumulative): (Vec<u64>, Vec<u64>) = buckets.into_iter().unzip();
    percentiles_from_buckets(&bounds, &cumulative, sum_ns, count)
}

/// "0.0000025" → 2500: exact for the decimal bounds the registry writes.
fn seconds_to_ns(s: &str) -> Option<u64> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let frac_ns: u64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").parse().ok()?
    };
    whole.checked_mul(1_000_000_000)?.checked_add(frac_ns)
}

impl GatewayStages {
    /// A gateway's figures from its `/metrics` (stage legs over all command kinds).
    pub fn from_exposition(text: &str) -> GatewayStages {
        let stage = |s: &str| {
            percentiles_from_exposition(text, crate::names::STAGE_LATENCY_SECONDS, &[("stage", s)])
        };
        GatewayStages {
            door_to_door: percentiles_from_exposition(
                text,
                crate::names::ORDER_LATENCY_SECONDS,
                &[],
            ),
            decode: stage("decoded"),
            route: stage("to_sequencer"),
            // With t3..t5 unstamped at the gateway, the leg ending at t6 starts at t2.
            core_round_trip: stage("encoded"),
            respond: stage("written"),
        }
    }
}

impl NodeStages {
    /// A replica node's figures from its `/metrics` (kind `entry` legs).
    pub fn from_exposition(text: &str) -> NodeStages {
        let stage = |s: &str| {
            percentiles_from_exposition(
                text,
                crate::names::STAGE_LATENCY_SECONDS,
                &[("kind", "entry"), ("stage", s)],
            )
        };
        NodeStages {
            to_append: stage("appended"),
            commit: stage("committed"),
            apply: stage("processed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::{Stage, Trace};
    use crate::{Monitor, MonitorConfig};
    use bourse_core::CommandKind;

    fn p(mean: u64) -> Percentiles {
        Percentiles {
            count: 100,
            mean,
            p50: mean,
            p90: mean,
            p99: mean * 2,
            p999: mean * 2,
            p9999: mean * 2,
            max: mean * 3,
        }
    }

    #[test]
    fn the_round_trip_splits_into_the_five_parts_and_the_means_add_up() {
        // Client 1000 µs; gateway door to door 600 (decode 50, route 30, core 500, respond 20);
        // node: append 100, commit 200, apply 50 → residence 350, ipc 150, network 400.
        let gw = GatewayStages {
            door_to_door: Some(p(600_000)),
            decode: Some(p(50_000)),
            route: Some(p(30_000)),
            core_round_trip: Some(p(500_000)),
            respond: Some(p(20_000)),
        };
        let node = NodeStages {
            to_append: Some(p(100_000)),
            commit: Some(p(200_000)),
            apply: Some(p(50_000)),
        };
        let b = derive(Some(&p(1_000_000)), &gw, &node);
        let parts: Vec<_> = b.rows.iter().map(|r| (r.part, r.mean_ns)).collect();
        assert_eq!(
            parts,
            vec![
                ("network", 400_000),
                ("gateway", 100_000),
                ("ipc", 150_000),
                ("replication", 300_000),
                ("matching", 50_000),
            ]
        );
        assert_eq!(
            b.total_mean_ns, 1_000_000,
            "the parts add up to the round trip"
        );
        assert!((b.rows[0].share - 0.4).abs() < 1e-9);
        assert_eq!(
            b.rows[0].p99_ns, 800_000,
            "p99s subtract as the LTP tables do"
        );
        assert!(b.notes.is_empty(), "{:?}", b.notes);
    }

    #[test]
    fn missing_inputs_are_named_not_invented() {
        let gw = GatewayStages {
            door_to_door: Some(p(600_000)),
            core_round_trip: Some(p(500_000)),
            ..GatewayStages::default()
        };
        let node = NodeStages {
            commit: Some(p(200_000)),
            apply: Some(p(50_000)),
            ..NodeStages::default()
        };
        let b = derive(None, &gw, &node);
        let parts: Vec<_> = b.rows.iter().map(|r| (r.part, r.mean_ns)).collect();
        assert_eq!(
            parts,
            vec![
                ("gateway", 100_000),
                ("ipc", 250_000),
                ("replication", 200_000),
                ("matching", 50_000)
            ]
        );
        assert_eq!(b.notes.len(), 2, "{:?}", b.notes);
    }

    #[test]
    fn histograms_read_back_from_two_processes_expositions_derive_the_table() {
        // A gateway process: t0, t1, t2, t6, t7 stamped; a node process: entry legs.
        let cfg = MonitorConfig {
            sample_every: 1,
            ..MonitorConfig::default()
        };
        let gateway = Monitor::new(cfg.clone());
        let mut r = gateway.probes().recorder();
        for i in 0..1_000u64 {
            let mut t = Trace::new(CommandKind::NewOrder);
            let t0 = 1_000_000 + i;
            t.stamp_at(Stage::SocketRead, t0);
            t.stamp_at(Stage::Decoded, t0 + 20_000);
            t.stamp_at(Stage::ToSequencer, t0 + 30_000);
            t.stamp_at(Stage::Encoded, t0 + 430_000);
            t.stamp_at(Stage::Written, t0 + 440_000);
            r.record(&t);
        }
        r.flush();
        let node = Monitor::new(cfg);
        let mut r = node.probes().recorder();
        for _ in 0..1_000 {
            r.record_entry_leg(Stage::Committed, 150_000);
            r.record_entry_leg(Stage::Processed, 30_000);
        }
        r.flush();
        let gw = GatewayStages::from_exposition(&gateway.render_metrics());
        let nd = NodeStages::from_exposition(&node.render_metrics());
        assert_eq!(gw.door_to_door.unwrap().count, 1_000);
        assert_eq!(gw.door_to_door.unwrap().mean, 440_000);
        assert_eq!(gw.core_round_trip.unwrap().mean, 400_000);
        assert_eq!(nd.commit.unwrap().mean, 150_000);
        assert!(nd.to_append.is_none());
        // A client that measured 1 ms round trips.
        let b = derive(Some(&p(1_000_000)), &gw, &nd);
        let mean = |part: &str| b.rows.iter().find(|r| r.part == part).unwrap().mean_ns;
        assert_eq!(mean("network"), 560_000);
        assert_eq!(mean("gateway"), 40_000);
        assert_eq!(mean("ipc"), 220_000);
        assert_eq!(mean("replication"), 150_000);
        assert_eq!(mean("matching"), 30_000);
        // Percentiles come from buckets: 400 µs lies in the (250 µs, 500 µs] bucket.
        let core = gw.core_round_trip.unwrap();
        assert!(core.p50 > 250_000 && core.p50 <= 500_000, "{core:?}");
    }

    #[test]
    fn bucket_bounds_parse_exactly() {
        assert_eq!(seconds_to_ns("0.0000025"), Some(2_500));
        assert_eq!(seconds_to_ns("10"), Some(10_000_000_000));
        assert_eq!(seconds_to_ns("0.25"), Some(250_000_000));
        assert_eq!(seconds_to_ns("x"), None);
        assert_eq!(seconds_to_ns("0.0000000001"), None);
    }
}
