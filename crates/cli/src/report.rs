//! Shared pieces of every benchmark and summary: HDR histograms summarised as percentiles, the
//! machine's description, and the JSON shape DESIGN.md gives for benchmark results.

/// The one latency summary (see `bourse_latency`), and how benchmarks fill its histogram.
pub use bourse_latency::{histogram, record, Latency};

/// The machine a figure was measured on (cpus, model, kernel and the load average, so that a
/// figure from a shared machine says so). One description serves benchmarks and load tests.
pub use bourse_loadgen::results::Machine;

pub fn version() -> &'static str {
    env!("BOURSE_GIT_DESCRIBE")
}

/// Formats nanoseconds for people: "850 ns", "12.3 µs", "4.56 ms".
pub fn ns(v: u64) -> String {
    if v < 1_000 {
        format!("{v} ns")
    } else if v < 1_000_000 {
        format!("{:.1} µs", v as f64 / 1e3)
    } else if v < 1_000_000_000 {
        format!("{:.2} ms", v as f64 / 1e6)
    } else {
        format!("{:.2} s", v as f64 / 1e9)
    }
}

/// Formats a count with thousands separators: 1234567 → "1,234,567".
pub fn count(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One row of a latency table: name, count, p50 … max.
pub fn latency_row(name: &str, l: &Latency) -> String {
    format!(
        "  {:<12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        name,
        count(l.count),
        ns(l.p50),
        ns(l.p90),
        ns(l.p99),
        ns(l.p999),
        ns(l.p9999),
        ns(l.max)
    )
}

pub fn latency_header() -> String {
    format!(
        "  {:<12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "command", "count", "p50", "p90", "p99", "p99.9", "p99.99", "max"
    )
}

/// Resident memory of this process in bytes (Linux), or 0 where unknown.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(count(12), "12");
        assert_eq!(ns(850), "850 ns");
        assert_eq!(ns(12_300), "12.3 µs");
    }
}
