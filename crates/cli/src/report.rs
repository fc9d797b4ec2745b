//! What the binary's summaries share (the demo, load tests and benchmarks): numbers formatted
//! for people, the version, the machine's description and this process's resident memory.
//! The benchmarks' own shared pieces are in `bench::common`.

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
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The peak resident memory of this process so far in bytes (Linux's `VmHWM`), or 0 where
/// unknown.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
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
