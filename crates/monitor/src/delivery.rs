//! The dashboard's delivery panel: seed 003's own figures of a data-delivery node in this
//! process (writes per second, readers, polls and the share of empty answers, records per
//! answer, lag, and the time to select and to answer a poll).
//!
//! The monitor does not depend on the delivery crate: a delivery node hands
//! [`DeliveryFeed::set_source`] a function that reads its counters as [`DeliveryTotals`], and
//! once per tick [`DeliveryFeed::panel`] turns the totals since the previous tick into rates
//! and interval figures. A process without a delivery node has no panel.

use crate::metrics::Histogram;
use serde::Serialize;
use std::sync::Mutex;

/// A delivery node's running totals, as its counters hold them.
#[derive(Clone, Debug, Default)]
pub struct DeliveryTotals {
    /// Records written into the store.
    pub records_written: u64,
    /// Polls received over both fronts, and those answered with nothing.
    pub polls: u64,
    pub polls_empty: u64,
    /// Polls refused (busy, bad request, catching up, filter not served).
    pub polls_refused: u64,
    /// Records sent in answers.
    pub records_sent: u64,
    /// Open connections per front: the readers.
    pub readers_http: i64,
    pub readers_binary: i64,
    /// Per record sent, how late the reader learned of it; per poll, the select and the
    /// whole answer.
    pub lag: Option<Histogram>,
    pub select: Option<Histogram>,
    pub answer: Option<Histogram>,
}

/// The frame's delivery part, over the interval now ending.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeliveryPanel {
    pub writes_per_s: f64,
    pub polls_per_s: f64,
    /// Empty answers over answers in the interval (0 when there were none).
    pub empty_share: f64,
    pub refused_per_s: f64,
    pub records_sent_per_s: f64,
    /// Records per answer in the interval (the seed's batch size).
    pub records_per_answer: f64,
    pub readers_http: i64,
    pub readers_binary: i64,
    /// Mean and bucket-bound p99 in the interval (`None` without observations).
    pub lag_mean_us: Option<f64>,
    pub lag_p99_us_max: Option<f64>,
    pub select_mean_us: Option<f64>,
    pub answer_mean_us: Option<f64>,
    pub answer_p99_us_max: Option<f64>,
    pub records_written: u64,
    pub records_sent: u64,
}

type Source = Box<dyn Fn() -> DeliveryTotals + Send + Sync>;

#[derive(Default)]
struct FeedState {
    source: Option<Source>,
    previous: Option<Interval>,
}

/// What the panel remembers of the previous tick.
#[derive(Clone, Default)]
struct Interval {
    totals: [u64; 5],
    lag: Vec<u64>,
    select: Vec<u64>,
    answer: Vec<u64>,
}

/// Where a delivery node plugs its counters in; see the module documentation.
#[derive(Default)]
pub struct DeliveryFeed {
    state: Mutex<FeedState>,
}

impl DeliveryFeed {
    /// Makes `source` the node whose figures the panel shows (the last one set wins).
    pub fn set_source(&self, source: impl Fn() -> DeliveryTotals + Send + Sync + 'static) {
        if let Ok(mut s) = self.state.lock() {
            s.source = Some(Box::new(source));
            s.previous = None;
        }
    }

    /// The panel for the interval of `interval_s` seconds now ending (0: the first, whose
    /// rates are 0); `None` without a delivery node.
    pub fn panel(&self, interval_s: f64) -> Option<DeliveryPanel> {
        let mut s = self.state.lock().ok()?;
        let t = (s.source.as_ref()?)();
        let now = Interval {
            totals: [
                t.records_written,
                t.polls,
                t.polls_empty,
                t.polls_refused,
                t.records_sent,
            ],
            lag: cells(&t.lag),
            select: cells(&t.select),
            answer: cells(&t.answer),
        };
        let before = s
            .previous
            .replace(now.clone())
            .unwrap_or_else(|| now.clone());
        let d = |i: usize| now.totals[i].saturating_sub(before.totals[i]);
        let rate = |n: u64| {
            if interval_s > 0.0 {
                n as f64 / interval_s
            } else {
                0.0
            }
        };
        let answered = d(1).saturating_sub(d(3));
        let ratio = |n: u64, of: u64| if of == 0 { 0.0 } else { n as f64 / of as f64 };
        let lag = diff(&t.lag, &now.lag, &before.lag);
        let answer = diff(&t.answer, &now.answer, &before.answer);
        Some(DeliveryPanel {
            writes_per_s: rate(d(0)),
            polls_per_s: rate(d(1)),
            empty_share: ratio(d(2), answered),
            refused_per_s: rate(d(3)),
            records_sent_per_s: rate(d(4)),
            records_per_answer: ratio(d(4), answered),
            readers_http: t.readers_http,
            readers_binary: t.readers_binary,
            lag_mean_us: lag.as_ref().and_then(IntervalHistogram::mean_us),
            lag_p99_us_max: lag.as_ref().and_then(|h| h.quantile_bound_us(0.99)),
            select_mean_us: diff(&t.select, &now.select, &before.select)
                .as_ref()
                .and_then(IntervalHistogram::mean_us),
            answer_mean_us: answer.as_ref().and_then(IntervalHistogram::mean_us),
            answer_p99_us_max: answer.as_ref().and_then(|h| h.quantile_bound_us(0.99)),
            records_written: t.records_written,
            records_sent: t.records_sent,
        })
    }
}

/// A histogram's cells as the panel keeps them: its buckets, then its sum and count.
fn cells(h: &Option<Histogram>) -> Vec<u64> {
    h.as_ref().map_or_else(Vec::new, |h| {
        let mut v = h.bucket_counts();
        v.push(h.sum_ns());
        v.push(h.count());
        v
    })
}

/// One interval of a histogram: bucket counts with their upper bounds, sum and count.
struct IntervalHistogram {
    bounds_ns: &'static [u64],
    buckets: Vec<u64>,
    sum_ns: u64,
    count: u64,
}

fn diff(h: &Option<Histogram>, now: &[u64], before: &[u64]) -> Option<IntervalHistogram> {
    let h = h.as_ref()?;
    if now.len() != before.len() || now.len() < 2 {
        return None;
    }
    let d: Vec<u64> = now
        .iter()
        .zip(before)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    let (buckets, tail) = d.split_at(d.len() - 2);
    Some(IntervalHistogram {
        bounds_ns: h.bounds_ns(),
        buckets: buckets.to_vec(),
        sum_ns: tail[0],
        count: tail[1],
    })
}

impl IntervalHistogram {
    fn mean_us(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ns as f64 / self.count as f64 / 1e3)
    }

    /// The upper bound of the bucket holding the `q` quantile: the true value is at most
    /// this (the +Inf bucket reports the largest finite bound).
    fn quantile_bound_us(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((self.count as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let bound = self
                    .bounds_ns
                    .get(i)
                    .or(self.bounds_ns.last())
                    .copied()
                    .unwrap_or(0);
                return Some(bound as f64 / 1e3);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Registry;
    use std::sync::Arc;

    #[test]
    fn the_panel_shows_the_interval_since_the_previous_tick() {
        let r = Registry::new();
        let lag = r.histogram("lag", "h", &[]);
        let totals = Arc::new(Mutex::new(DeliveryTotals {
            lag: Some(lag.clone()),
            ..DeliveryTotals::default()
        }));
        let feed = DeliveryFeed::default();
        assert!(feed.panel(1.0).is_none(), "no node, no panel");
        let source = totals.clone();
        feed.set_source(move || source.lock().unwrap().clone());
        let first = feed.panel(0.0).unwrap();
        assert_eq!((first.writes_per_s, first.lag_mean_us), (0.0, None));

        {
            let mut t = totals.lock().unwrap();
            t.records_written = 1_000;
            t.polls = 110;
            t.polls_empty = 20;
            t.polls_refused = 10;
            t.records_sent = 400;
            t.readers_binary = 7;
        }
        for _ in 0..99 {
            lag.observe_ns(200_000);
        }
        lag.observe_ns(40_000_000);
        let p = feed.panel(2.0).unwrap();
        assert_eq!(p.writes_per_s, 500.0);
        assert_eq!(p.polls_per_s, 55.0);
        assert_eq!(p.refused_per_s, 5.0);
        assert_eq!(p.empty_share, 0.2, "20 empty of 100 answered");
        assert_eq!(p.records_per_answer, 4.0);
        assert_eq!(p.readers_binary, 7);
        let mean = p.lag_mean_us.unwrap();
        assert!(
            (mean - (99.0 * 200.0 + 40_000.0) / 100.0).abs() < 1e-6,
            "{mean}"
        );
        let p99 = p.lag_p99_us_max.unwrap();
        assert!(
            (200.0..40_000.0).contains(&p99),
            "the 99th of 100 is a 200 µs one: {p99}"
        );

        // Nothing new: rates fall to zero, totals stay.
        let q = feed.panel(1.0).unwrap();
        assert_eq!(
            (q.writes_per_s, q.lag_mean_us, q.records_written),
            (0.0, None, 1_000)
        );
    }
}
