//! One latency summary for the whole project: [`Latency`] holds the count, mean, p50, p90, p99,
//! p99.9, p99.99 and max of an HDR histogram, in nanoseconds, with one serde form. Benchmarks,
//! load test reports, the monitor's dashboard and the journal's benchmark all use it.
//!
//! [`histogram`] and [`record`] are the benchmarks' way to fill one: 1 ns to 100 s, three
//! significant digits, values past the range clamped rather than dropped.
//!
//! It depends on `hdrhistogram` and `serde` only, so the lightest crates (the journal) can use
//! it without pulling in the runtime the monitor needs.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// The highest value [`histogram`] records: 100 s in nanoseconds.
pub const HISTOGRAM_NS_MAX: u64 = 100_000_000_000;

/// Percentiles of a latency histogram, in nanoseconds (all zero for an empty one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latency {
    pub count: u64,
    pub mean: u64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    /// Absent from reports written before the types were merged; read there as 0.
    #[serde(default)]
    pub p9999: u64,
    pub max: u64,
}

impl Latency {
    /// The summary of `h`; an empty histogram gives all zeros.
    pub fn of(h: &Histogram<u64>) -> Latency {
        Latency::of_recorded(h).unwrap_or_default()
    }

    /// The summary of `h`, or `None` when it holds no value (where "nothing measured" must
    /// read differently from a zero latency).
    pub fn of_recorded(h: &Histogram<u64>) -> Option<Latency> {
        if h.is_empty() {
            return None;
        }
        Some(Latency {
            count: h.len(),
            mean: h.mean() as u64,
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            p9999: h.value_at_quantile(0.9999),
            max: h.max(),
        })
    }
}

/// A histogram for latencies: 1 ns to 100 s with 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HISTOGRAM_NS_MAX, 3).expect("valid histogram bounds")
}

/// Records `ns`, clamped into the histogram's range (a value past its highest is recorded as
/// the highest, so that a stall is never dropped from the figures).
pub fn record(h: &mut Histogram<u64>, ns: u64) {
    let v = ns.clamp(1, h.high());
    h.record(v).expect("value clamped into range");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_histogram() {
        let mut h = histogram();
        for v in 1..=1000 {
            record(&mut h, v);
        }
        let l = Latency::of(&h);
        assert_eq!(l.count, 1000);
        assert!((495..=505).contains(&l.p50));
        assert!((985..=995).contains(&l.p99));
        assert_eq!(l.max, 1000);
        assert_eq!(Latency::of_recorded(&h), Some(l));
    }

    #[test]
    fn an_empty_histogram_is_zero_or_none() {
        let h = histogram();
        assert_eq!(Latency::of(&h), Latency::default());
        assert_eq!(Latency::of_recorded(&h), None);
    }

    #[test]
    fn a_stall_past_the_range_is_kept_at_the_top() {
        let mut h = histogram();
        record(&mut h, u64::MAX);
        record(&mut h, 0);
        assert_eq!(h.len(), 2);
        assert!(Latency::of(&h).max >= HISTOGRAM_NS_MAX);
    }

    #[test]
    fn reports_without_p9999_still_read() {
        let old = r#"{"count":3,"mean":2,"p50":2,"p90":3,"p99":3,"p999":3,"max":3}"#;
        let l: Latency = serde_json::from_str(old).unwrap();
        assert_eq!((l.count, l.p9999, l.max), (3, 0, 3));
        let back: Latency = serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
        assert_eq!(back, l);
    }
}
