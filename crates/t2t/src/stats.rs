//! The figures the seed reports (min, mean, max, stddev, 95/97/99/99.9th percentiles, in ns)
//! from an HDR histogram, the same split by packet size, and a text histogram.

use bourse_latency::{histogram, record};
use hdrhistogram::Histogram;
use serde::Serialize;

/// Packet sizes (updates per packet) grouped in powers of two for the size curve.
pub const SIZE_CLASSES: [(u16, u16); 8] = [
    (1, 1),
    (2, 3),
    (4, 7),
    (8, 15),
    (16, 31),
    (32, 63),
    (64, 127),
    (128, 128),
];

/// The size class of a packet of `updates` updates (0 updates counts with 1).
pub fn size_class(updates: u16) -> usize {
    SIZE_CLASSES
        .iter()
        .position(|&(lo, hi)| (lo..=hi).contains(&updates.max(1)))
        .unwrap_or(SIZE_CLASSES.len() - 1)
}

/// The seed's row of figures, in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: u64,
    pub min: u64,
    pub mean: u64,
    pub max: u64,
    pub stddev: u64,
    pub p50: u64,
    pub p95: u64,
    pub p97: u64,
    pub p99: u64,
    pub p999: u64,
}

impl Summary {
    pub fn of(h: &Histogram<u64>) -> Summary {
        if h.is_empty() {
            return Summary::default();
        }
        Summary {
            count: h.len(),
            min: h.min(),
            mean: h.mean().round() as u64,
            max: h.max(),
            stddev: h.stdev().round() as u64,
            p50: h.value_at_quantile(0.50),
            p95: h.value_at_quantile(0.95),
            p97: h.value_at_quantile(0.97),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
        }
    }
}

/// The seed's results (ns): min, mean, max, stddev, 95%, 97%, 99%, 99.9%.
pub const SEED_ROWS: [(&str, [u64; 8]); 3] = [
    (
        "seed: Solarflare TCPDirect (kernel bypass)",
        [1411, 1637, 2638, 150, 2022, 2116, 2303, 2619],
    ),
    (
        "seed: CEPappliance FPGA, high-level language",
        [1050, 1125, 1620, 45, 1251, 1320, 1415, 1549],
    ),
    (
        "seed: CEPappliance FPGA, Verilog",
        [561, 640, 1163, 45, 768, 825, 907, 1087],
    ),
];

/// The header of [`table_row`]'s table.
pub fn table_header() -> String {
    "| SUT | min | mean | p50 | max | stddev | 95% | 97% | 99% | 99.9% | count |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into()
}

/// One row of the seed's table.
pub fn table_row(name: &str, s: &Summary) -> String {
    format!(
        "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        s.min, s.mean, s.p50, s.max, s.stddev, s.p95, s.p97, s.p99, s.p999, s.count
    )
}

/// The seed's own rows.
pub fn seed_rows() -> String {
    SEED_ROWS
        .iter()
        .map(|(name, v)| {
            format!(
                "| {name} | {} | {} | – | {} | {} | {} | {} | {} | {} | 90,000 |",
                v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A latency histogram per size class.
#[derive(Clone, Debug)]
pub struct BySize {
    pub all: Histogram<u64>,
    pub classes: Vec<Histogram<u64>>,
}

impl Default for BySize {
    fn default() -> Self {
        BySize {
            all: histogram(),
            classes: SIZE_CLASSES.iter().map(|_| histogram()).collect(),
        }
    }
}

/// One row of the size curve.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct SizeRow {
    pub updates_min: u16,
    pub updates_max: u16,
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub mean: u64,
}

impl BySize {
    /// Records one value for a packet of `updates` updates (no allocation).
    #[inline]
    pub fn record(&mut self, updates: u16, ns: u64) {
        record(&mut self.all, ns);
        record(&mut self.classes[size_class(updates)], ns);
    }

    pub fn rows(&self) -> Vec<SizeRow> {
        SIZE_CLASSES
            .iter()
            .zip(&self.classes)
            .filter(|(_, h)| !h.is_empty())
            .map(|(&(lo, hi), h)| SizeRow {
                updates_min: lo,
                updates_max: hi,
                count: h.len(),
                p50: h.value_at_quantile(0.5),
                p99: h.value_at_quantile(0.99),
                mean: h.mean().round() as u64,
            })
            .collect()
    }
}

/// The size curve as a table.
pub fn size_table(title: &str, rows: &[SizeRow]) -> String {
    let mut out = format!("| updates per packet | {title} count | p50 ns | p99 ns | mean ns |\n|---|---:|---:|---:|---:|\n");
    for r in rows {
        let range = if r.updates_min == r.updates_max {
            r.updates_min.to_string()
        } else {
            format!("{}-{}", r.updates_min, r.updates_max)
        };
        out.push_str(&format!(
            "| {range} | {} | {} | {} | {} |\n",
            r.count, r.p50, r.p99, r.mean
        ));
    }
    out
}

/// A text histogram: buckets of width growing by 1.25x from the minimum, one bar each.
pub fn text_histogram(h: &Histogram<u64>, bar_width: usize) -> String {
    if h.is_empty() {
        return "(no values)\n".into();
    }
    let mut edges = Vec::new();
    let mut edge = h.min().max(1) as f64;
    while (edge as u64) <= h.max() {
        edges.push(edge as u64);
        edge = (edge * 1.25).max(edge + 1.0);
    }
    edges.push(h.max() + 1);
    let counts: Vec<u64> = edges
        .windows(2)
        .map(|w| h.count_between(w[0], w[1] - 1))
        .collect();
    let top = counts.iter().copied().max().unwrap_or(1).max(1);
    let mut out = String::new();
    for (w, &c) in edges.windows(2).zip(&counts) {
        if c == 0 {
            continue;
        }
        let bar = ((c as f64 / top as f64) * bar_width as f64).ceil() as usize;
        out.push_str(&format!(
            "{:>9} .. {:>9} ns {:>8} {}\n",
            w[0],
            w[1] - 1,
            c,
            "#".repeat(bar)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_fall_in_their_power_of_two_class() {
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(1), 0);
        assert_eq!(size_class(3), 1);
        assert_eq!(size_class(64), 6);
        assert_eq!(size_class(127), 6);
        assert_eq!(size_class(128), 7);
    }

    #[test]
    fn the_summary_has_the_seed_columns() {
        let mut h = histogram();
        for v in 1..=1000 {
            record(&mut h, v);
        }
        let s = Summary::of(&h);
        assert_eq!((s.count, s.min, s.max), (1000, 1, 1000));
        assert!((949..=951).contains(&s.p95));
        assert!((969..=971).contains(&s.p97));
        assert!(s.stddev > 280 && s.stddev < 300);
        let text = text_histogram(&h, 20);
        let total: u64 = text
            .lines()
            .map(|l| l.split_whitespace().nth(4).unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(total, 1000);
    }
}
