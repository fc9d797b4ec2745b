//! A small Prometheus registry: counters, gauges and histograms behind cheap handles.
//!
//! Registration (name, help, labels) happens on the control plane and takes a lock; the
//! handles it returns are `Arc`s of atomics, so updating a metric on the hot path is one
//! relaxed atomic operation (a histogram observation is three), with no lock and no
//! allocation. Registering the same name and labels twice returns the same series, so crates
//! can ask for their handles wherever it is convenient.
//!
//! The text exposition follows the Prometheus format 0.0.4: `# HELP` and `# TYPE` once per
//! family, label values escaped, histograms as cumulative `_bucket{le=…}` series with `_sum` and
//! `_count`, latencies in seconds (base units) although they are recorded in nanoseconds.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bucket upper bounds for latency histograms, in nanoseconds: 1 µs to 10 s in 1-2.5-5 steps,
/// fine enough to read a p99 of a few hundred microseconds.
pub const LATENCY_BUCKETS_NS: &[u64] = &[
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Families a registry holds at most; a registration past it returns a detached handle (it
/// works but is not exported) rather than growing without bound.
pub const FAMILIES_MAX: usize = 512;
/// Label sets one family holds at most, for the same reason.
pub const SERIES_PER_FAMILY_MAX: usize = 4096;

/// A monotonically increasing count. Cloning shares the series.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    #[inline]
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    /// Raises the count to `total` if it is below (for mirroring a count kept elsewhere; a
    /// counter never goes down).
    pub fn raise_to(&self, total: u64) {
        self.0.fetch_max(total, Ordering::Relaxed);
    }
}

/// A value that goes up and down (queue depth, commit index, sessions). Integers only: every
/// gauge bourse exports counts something.
#[derive(Clone, Debug, Default)]
pub struct Gauge(Arc<AtomicI64>);

impl Gauge {
    #[inline]
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    #[inline]
    pub fn add(&self, v: i64) {
        self.0.fetch_add(v, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// One unit held on a gauge: added when made, taken back when dropped (an open connection,
/// say), so the gauge is right however its holder ends.
pub struct GaugeHold(Gauge);

impl GaugeHold {
    pub fn new(gauge: &Gauge) -> GaugeHold {
        gauge.add(1);
        GaugeHold(gauge.clone())
    }
}

impl Drop for GaugeHold {
    fn drop(&mut self) {
        self.0.add(-1);
    }
}

/// A Prometheus histogram of durations recorded in nanoseconds and exported in seconds.
#[derive(Clone, Debug)]
pub struct Histogram(Arc<HistogramCells>);

#[derive(Debug)]
pub struct HistogramCells {
    bounds_ns: &'static [u64],
    /// Non-cumulative counts per bucket; the last cell is the +Inf bucket.
    buckets: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds_ns: &'static [u64]) -> Histogram {
        Histogram(Arc::new(HistogramCells {
            bounds_ns,
            buckets: (0..=bounds_ns.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }))
    }
    #[inline]
    pub fn observe_ns(&self, ns: u64) {
        let c = &self.0;
        let i = c.bounds_ns.partition_point(|&b| b < ns);
        c.buckets[i].fetch_add(1, Ordering::Relaxed);
        c.sum_ns.fetch_add(ns, Ordering::Relaxed);
        c.count.fetch_add(1, Ordering::Relaxed);
    }
    pub fn observe(&self, d: std::time::Duration) {
        self.observe_ns(d.as_nanos().min(u64::MAX as u128) as u64);
    }
    pub fn count(&self) -> u64 {
        self.0.count.load(Ordering::Relaxed)
    }
    /// Replaces the whole content with a histogram kept elsewhere over the same bounds:
    /// `buckets` holds non-cumulative counts per bound plus the `+Inf` cell. Returns false
    /// (and changes nothing) if the shape does not match.
    pub fn mirror(&self, buckets: &[u64], sum_ns: u64, count: u64) -> bool {
        let c = &self.0;
        if buckets.len() != c.buckets.len() {
            return false;
        }
        for (cell, n) in c.buckets.iter().zip(buckets) {
            cell.store(*n, Ordering::Relaxed);
        }
        c.sum_ns.store(sum_ns, Ordering::Relaxed);
        c.count.store(count, Ordering::Relaxed);
        true
    }
    pub fn sum_ns(&self) -> u64 {
        self.0.sum_ns.load(Ordering::Relaxed)
    }

    /// The non-cumulative count of every bucket, the `+Inf` cell last.
    pub fn bucket_counts(&self) -> Vec<u64> {
        self.0
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }

    /// The buckets' upper bounds in nanoseconds (without `+Inf`).
    pub fn bounds_ns(&self) -> &'static [u64] {
        self.0.bounds_ns
    }

    /// Adds every value of an HDR histogram of nanoseconds recorded elsewhere (one interval
    /// of it), with that interval's exact sum. Each HDR bucket lands in the bucket of its
    /// highest equivalent value, so a value within the HDR's precision of a bound may count
    /// one bucket up; control plane only (a loop over the recorded values).
    pub fn add_hdr(&self, h: &hdrhistogram::Histogram<u64>, sum_ns: u64) {
        if h.is_empty() {
            return;
        }
        let c = &self.0;
        for v in h.iter_recorded() {
            let i = c.bounds_ns.partition_point(|&b| b < v.value_iterated_to());
            c.buckets[i].fetch_add(v.count_at_value(), Ordering::Relaxed);
        }
        c.sum_ns.fetch_add(sum_ns, Ordering::Relaxed);
        c.count.fetch_add(h.len(), Ordering::Relaxed);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

#[derive(Clone, Debug)]
enum Cell {
    Counter(Counter),
    Gauge(Gauge),
    Histogram(Histogram),
}

struct Series {
    labels: Vec<(String, String)>,
    /// `{a="1",b="2"}` or empty, rendered once at registration.
    rendered: String,
    cell: Cell,
}

struct Family {
    name: String,
    help: String,
    kind: Kind,
    series: Vec<Series>,
}

/// The set of metric families one process exports.
#[derive(Default)]
pub struct Registry {
    families: Mutex<Vec<Family>>,
}

/// Makes `s` a valid metric or label name: `[a-zA-Z_:][a-zA-Z0-9_:]*` (colons not in labels).
fn sanitize_name(s: &str, allow_colon: bool) -> String {
    let mut out = String::with_capacity(s.len().max(1));
    for (i, c) in s.chars().enumerate() {
        let ok = c.is_ascii_alphabetic()
            || c == '_'
            || (allow_colon && c == ':')
            || (i > 0 && c.is_ascii_digit());
        out.push(if ok { c } else { '_' });
    }
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// Escapes a label value: backslash, double quote and newline, as the format requires.
pub fn escape_label_value(v: &str, out: &mut String) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// `{a="1",b="2"}` from label pairs (sanitised names, escaped values); empty for no labels.
pub fn render_labels(labels: &[(String, String)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let mut s = String::from("{");
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(k);
        s.push_str("=\"");
        escape_label_value(v, &mut s);
        s.push('"');
    }
    s.push('}');
    s
}

/// Formats nanoseconds as seconds with nine decimals, trimmed: exact, no float rounding.
pub fn ns_as_seconds(ns: u64, out: &mut String) {
    let whole = ns / 1_000_000_000;
    let frac = ns % 1_000_000_000;
    if frac == 0 {
        let _ = write!(out, "{whole}");
    } else {
        let f = format!("{frac:09}");
        let _ = write!(out, "{whole}.{}", f.trim_end_matches('0'));
    }
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    fn register(&self, name: &str, help: &str, kind: Kind, labels: &[(&str, &str)]) -> Cell {
        let name = sanitize_name(name, true);
        let mut labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (sanitize_name(k, false), (*v).to_string()))
            .collect();
        labels.sort();
        labels.dedup_by(|a, b| a.0 == b.0);
        let make = || match kind {
            Kind::Counter => Cell::Counter(Counter::default()),
            Kind::Gauge => Cell::Gauge(Gauge::default()),
            Kind::Histogram => Cell::Histogram(Histogram::new(LATENCY_BUCKETS_NS)),
        };
        let Ok(mut families) = self.families.lock() else {
            return make();
        };
        let fi = match families.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                if families.len() >= FAMILIES_MAX {
                    return make();
                }
                families.push(Family {
                    name: name.clone(),
                    help: help.to_string(),
                    kind,
                    series: Vec::new(),
                });
                families.len() - 1
            }
        };
        let family = &mut families[fi];
        if family.kind != kind {
            // Same name, other type: a programming error elsewhere; keep the export valid.
            return make();
        }
        if let Some(s) = family.series.iter().find(|s| s.labels == labels) {
            return s.cell.clone();
        }
        if family.series.len() >= SERIES_PER_FAMILY_MAX {
            return make();
        }
        let cell = make();
        family.series.push(Series {
            rendered: render_labels(&labels),
            labels,
            cell: cell.clone(),
        });
        cell
    }

    pub fn counter(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Counter {
        match self.register(name, help, Kind::Counter, labels) {
            Cell::Counter(c) => c,
            _ => Counter::default(),
        }
    }

    pub fn gauge(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Gauge {
        match self.register(name, help, Kind::Gauge, labels) {
            Cell::Gauge(g) => g,
            _ => Gauge::default(),
        }
    }

    /// A latency histogram: observe nanoseconds, exported in seconds. Name it `…_seconds`.
    pub fn histogram(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Histogram {
        match self.register(name, help, Kind::Histogram, labels) {
            Cell::Histogram(h) => h,
            _ => Histogram::new(LATENCY_BUCKETS_NS),
        }
    }

    /// The sum of a counter family over all its label sets; `None` if nothing registered it.
    pub fn counter_sum(&self, name: &str) -> Option<u64> {
        let families = self.families.lock().ok()?;
        let f = families.iter().find(|f| f.name == name)?;
        if f.series.is_empty() {
            return None;
        }
        Some(
            f.series
                .iter()
                .map(|s| match &s.cell {
                    Cell::Counter(c) => c.get(),
                    _ => 0,
                })
                .sum(),
        )
    }

    /// The sum of a counter family over the series whose label `label` is `value`; `None` if
    /// no such series is registered.
    pub fn counter_sum_where(&self, name: &str, label: &str, value: &str) -> Option<u64> {
        let families = self.families.lock().ok()?;
        let mut found = None;
        for f in families.iter().filter(|f| f.name == name) {
            for s in &f.series {
                let matches = s.labels.iter().any(|(k, v)| k == label && v == value);
                if let (true, Cell::Counter(c)) = (matches, &s.cell) {
                    *found.get_or_insert(0) += c.get();
                }
            }
        }
        found
    }

    /// Every series of a counter family as (labels, value); empty if nothing registered it.
    pub fn counter_series(&self, name: &str) -> Vec<(Vec<(String, String)>, u64)> {
        let Ok(families) = self.families.lock() else {
            return Vec::new();
        };
        families
            .iter()
            .filter(|f| f.name == name)
            .flat_map(|f| f.series.iter())
            .filter_map(|s| match &s.cell {
                Cell::Counter(c) => Some((s.labels.clone(), c.get())),
                _ => None,
            })
            .collect()
    }

    /// Every series of a gauge family as (labels, value); empty if nothing registered it.
    pub fn gauge_series(&self, name: &str) -> Vec<(Vec<(String, String)>, i64)> {
        let Ok(families) = self.families.lock() else {
            return Vec::new();
        };
        families
            .iter()
            .filter(|f| f.name == name)
            .flat_map(|f| f.series.iter())
            .filter_map(|s| match &s.cell {
                Cell::Gauge(g) => Some((s.labels.clone(), g.get())),
                _ => None,
            })
            .collect()
    }

    /// Appends the text exposition of every family to `out`.
    pub fn render(&self, out: &mut String) {
        let Ok(families) = self.families.lock() else {
            return;
        };
        for f in families.iter() {
            if f.series.is_empty() {
                continue;
            }
            let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(&f.help));
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind.name());
            for s in &f.series {
                match &s.cell {
                    Cell::Counter(c) => {
                        let _ = writeln!(out, "{}{} {}", f.name, s.rendered, c.get());
                    }
                    Cell::Gauge(g) => {
                        let _ = writeln!(out, "{}{} {}", f.name, s.rendered, g.get());
                    }
                    Cell::Histogram(h) => {
                        let c = &h.0;
                        let counts: Vec<u64> = c
                            .buckets
                            .iter()
                            .map(|b| b.load(Ordering::Relaxed))
                            .collect();
                        // Read the count after the buckets and never export a total below
                        // their sum, so `+Inf` and `_count` stay consistent under updates.
                        let total = c.count.load(Ordering::Relaxed).max(counts.iter().sum());
                        let mut cumulative = Vec::with_capacity(counts.len());
                        let mut acc = 0u64;
                        for n in &counts[..counts.len() - 1] {
                            acc += n;
                            cumulative.push(acc);
                        }
                        render_histogram(
                            out,
                            &f.name,
                            &s.labels,
                            c.bounds_ns,
                            &cumulative,
                            c.sum_ns.load(Ordering::Relaxed),
                            total,
                        );
                    }
                }
            }
        }
    }
}

/// Writes one histogram series: cumulative buckets at `bounds_ns` (in seconds), `+Inf`, sum and
/// count. `cumulative[i]` counts observations `<= bounds_ns[i]`.
pub fn render_histogram(
    out: &mut String,
    name: &str,
    labels: &[(String, String)],
    bounds_ns: &[u64],
    cumulative: &[u64],
    sum_ns: u64,
    count: u64,
) {
    let base = render_labels(labels);
    let open = if base.is_empty() {
        "{".to_string()
    } else {
        format!("{},", &base[..base.len() - 1])
    };
    for (b, n) in bounds_ns.iter().zip(cumulative) {
        let _ = write!(out, "{name}_bucket{open}le=\"");
        ns_as_seconds(*b, out);
        let _ = writeln!(out, "\"}} {}", n.min(&count));
    }
    let _ = writeln!(out, "{name}_bucket{open}le=\"+Inf\"}} {count}");
    let _ = write!(out, "{name}_sum{base} ");
    ns_as_seconds(sum_ns, out);
    out.push('\n');
    let _ = writeln!(out, "{name}_count{base} {count}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_sum_where_takes_only_the_series_with_that_label_value() {
        let r = Registry::new();
        r.counter("rej_total", "r", &[("cause", "busy")]).add(5);
        r.counter("rej_total", "r", &[("cause", "core")]).add(7);
        assert_eq!(r.counter_sum_where("rej_total", "cause", "busy"), Some(5));
        assert_eq!(r.counter_sum_where("rej_total", "cause", "gateway"), None);
        assert_eq!(r.counter_sum("rej_total"), Some(12));
    }

    #[test]
    fn same_name_and_labels_share_one_series() {
        let r = Registry::new();
        let a = r.counter("x_total", "x", &[("k", "1")]);
        let b = r.counter("x_total", "x", &[("k", "1")]);
        a.inc();
        b.add(2);
        assert_eq!(a.get(), 3);
        assert_eq!(r.counter_sum("x_total"), Some(3));
        let c = r.counter("x_total", "x", &[("k", "2")]);
        c.inc();
        assert_eq!(r.counter_sum("x_total"), Some(4));
    }

    #[test]
    fn exposition_escapes_labels_and_exports_seconds() {
        let r = Registry::new();
        r.counter("bad name!", "h", &[("q", "a\"b\\c\nd")]).inc();
        let h = r.histogram("lat_seconds", "latency", &[]);
        h.observe_ns(1_500);
        h.observe_ns(20_000_000_000);
        let mut s = String::new();
        r.render(&mut s);
        assert!(s.contains("# TYPE bad_name_ counter\n"), "{s}");
        assert!(s.contains(r#"bad_name_{q="a\"b\\c\nd"} 1"#), "{s}");
        assert!(s.contains("lat_seconds_bucket{le=\"0.000001\"} 0\n"), "{s}");
        assert!(
            s.contains("lat_seconds_bucket{le=\"0.0000025\"} 1\n"),
            "{s}"
        );
        assert!(s.contains("lat_seconds_bucket{le=\"10\"} 1\n"), "{s}");
        assert!(s.contains("lat_seconds_bucket{le=\"+Inf\"} 2\n"), "{s}");
        assert!(s.contains("lat_seconds_sum 20.0000015\n"), "{s}");
        assert!(s.contains("lat_seconds_count 2\n"), "{s}");
    }

    #[test]
    fn an_hdr_interval_adds_into_the_buckets_with_its_exact_sum() {
        let r = Registry::new();
        let h = r.histogram("x_seconds", "x", &[("stage", "queue")]);
        let mut hdr =
            hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 2).unwrap();
        hdr.record(800).unwrap();
        hdr.record(40_000).unwrap();
        hdr.record(40_000).unwrap();
        h.add_hdr(&hdr, 80_800);
        h.add_hdr(&hdr, 80_800);
        let mut s = String::new();
        r.render(&mut s);
        assert!(
            s.contains("x_seconds_bucket{stage=\"queue\",le=\"0.000001\"} 2\n"),
            "{s}"
        );
        assert!(
            s.contains("x_seconds_bucket{stage=\"queue\",le=\"0.000025\"} 2\n"),
            "{s}"
        );
        assert!(
            s.contains("x_seconds_bucket{stage=\"queue\",le=\"0.00005\"} 6\n"),
            "{s}"
        );
        assert!(
            s.contains("x_seconds_sum{stage=\"queue\"} 0.0001616\n"),
            "{s}"
        );
        assert!(s.contains("x_seconds_count{stage=\"queue\"} 6\n"), "{s}");
    }

    #[test]
    fn a_name_registered_as_two_types_keeps_the_first() {
        let r = Registry::new();
        r.counter("m", "m", &[]).inc();
        r.gauge("m", "m", &[]).set(5);
        let mut s = String::new();
        r.render(&mut s);
        assert!(s.contains("# TYPE m counter\nm 1\n"), "{s}");
        assert!(!s.contains("gauge"), "{s}");
    }
}
