//! Whether the memory a configuration sets aside fits the machine, checked before it is
//! allocated.
//!
//! A capacity such as `orders_max` sizes tables that are reserved once, at start. When the
//! reservation is larger than the machine can give, the allocator does not return an error:
//! it aborts the process with a backtrace (`memory allocation of N bytes failed`, exit 134).
//! Every entry point that turns a configured capacity into memory therefore lists what it
//! will set aside as [`Preallocation`]s and calls [`check_fits`] (through
//! `bourse_cluster::machine::check_fits_machine`, which reads what the machine can give)
//! first, so that a capacity too large for the machine is refused with the setting's name,
//! the bytes it needs, the memory available and the largest value that would fit.
//!
//! This module is arithmetic and text only: the engine does no I/O, so reading the machine's
//! memory is left to the processes that start cores.

use std::fmt::Write as _;

/// What one setting makes a process set aside: `value` units of `unit_bytes` each, for
/// every one of `copies` (cores, nodes) that the process runs with the same setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preallocation {
    /// The flag or configuration key that sets the size, as the operator writes it.
    pub setting: String,
    /// The value the setting was given.
    pub value: u64,
    /// Bytes per unit of `value` for one copy.
    pub unit_bytes: u64,
    /// How many copies the process keeps (an engine per in-process core, say).
    pub copies: u64,
    /// What the memory holds, for the refusal ("the order table").
    pub what: String,
}

impl Preallocation {
    /// One copy of `value` units of `unit_bytes`, set by configuration key `setting`.
    pub fn new(setting: &str, value: u64, unit_bytes: u64, what: &str) -> Preallocation {
        Preallocation {
            setting: setting.to_string(),
            value,
            unit_bytes,
            copies: 1,
            what: what.to_string(),
        }
    }

    /// The same preallocation named by its command-line flag: `orders_max` becomes
    /// `--orders-max`, so that the refusal names what the operator typed.
    pub fn as_flag(mut self) -> Preallocation {
        self.setting = format!("--{}", self.setting.replace('_', "-"));
        self
    }

    /// The same preallocation made `copies` times over (one per core, per node).
    pub fn times(mut self, copies: u64) -> Preallocation {
        self.copies = self.copies.saturating_mul(copies);
        self
    }

    /// The bytes one unit of the value costs over all copies. Saturates rather than wraps:
    /// a product too large for a u64 is certainly more than any machine has.
    fn unit_bytes_all_copies(&self) -> u64 {
        self.unit_bytes.saturating_mul(self.copies)
    }

    /// The bytes the setting will set aside over all copies (saturating, as above).
    pub fn bytes(&self) -> u64 {
        self.value.saturating_mul(self.unit_bytes_all_copies())
    }
}

/// Refuses the preallocations when their sum exceeds `available_bytes`. The refusal blames
/// the largest of them and says how large its value may be, given what the others take, for
/// the sum to fit.
pub fn check_fits(preallocations: &[Preallocation], available_bytes: u64) -> Result<(), String> {
    let preallocations = merged(preallocations);
    if sum_bytes(preallocations.iter()) <= available_bytes {
        return Ok(());
    }
    let (largest_index, largest) = preallocations
        .iter()
        .enumerate()
        .max_by_key(|(_, p)| p.bytes())
        .expect("a sum above the memory available has at least one term");
    // Summed apart rather than as the total less the largest: a saturated total would hide
    // what the others take.
    let others = preallocations
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != largest_index)
        .map(|(_, p)| p);
    Err(refusal(largest, sum_bytes(others), available_bytes))
}

/// The preallocations with the copies of one setting (several cores configured alike) made
/// one entry, so that the largest value that fits is the value all of them may share.
fn merged(preallocations: &[Preallocation]) -> Vec<Preallocation> {
    let mut list: Vec<Preallocation> = Vec::with_capacity(preallocations.len());
    for p in preallocations {
        let alike = list.iter_mut().find(|q| {
            (&q.setting, q.value, q.unit_bytes, &q.what)
                == (&p.setting, p.value, p.unit_bytes, &p.what)
        });
        match alike {
            Some(q) => q.copies = q.copies.saturating_add(p.copies),
            None => list.push(p.clone()),
        }
    }
    list
}

/// The bytes of the preallocations together, saturating.
fn sum_bytes<'a>(preallocations: impl Iterator<Item = &'a Preallocation>) -> u64 {
    preallocations.fold(0u64, |sum, p| sum.saturating_add(p.bytes()))
}

/// The refusal naming `largest`, the setting blamed for not fitting in `available_bytes`
/// beside the `others_bytes` of the rest.
fn refusal(largest: &Preallocation, others_bytes: u64, available_bytes: u64) -> String {
    let room_bytes = available_bytes.saturating_sub(others_bytes);
    let fit_max = room_bytes / largest.unit_bytes_all_copies().max(1);
    let mut text = format!(
        "{} {} needs {} for {}",
        largest.setting,
        largest.value,
        format_bytes(largest.bytes()),
        largest.what
    );
    if largest.copies > 1 {
        let _ = write!(text, " ({} copies)", largest.copies);
    }
    if others_bytes > 0 {
        let _ = write!(
            text,
            ", besides {} for the other capacities",
            format_bytes(others_bytes)
        );
    }
    let _ = write!(
        text,
        "; this machine has {} available; at most {} fit",
        format_bytes(available_bytes),
        format_count(fit_max)
    );
    text
}

/// `MemAvailable` of a /proc/meminfo text, else its `MemTotal`, in bytes.
pub fn meminfo_available_bytes(meminfo: &str) -> Option<u64> {
    meminfo_field_bytes(meminfo, "MemAvailable:")
        .or_else(|| meminfo_field_bytes(meminfo, "MemTotal:"))
}

/// One `Name:   1234 kB` line of /proc/meminfo, in bytes.
fn meminfo_field_bytes(meminfo: &str, name: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with(name))?;
    let mut words = line[name.len()..].split_whitespace();
    let number: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => number.checked_mul(1024),
        None => Some(number),
        Some(_) => None,
    }
}

/// The limit a cgroup limit file holds: `max` (v2) or a figure near 2^63 (v1's "none") means
/// no limit.
pub fn cgroup_limit_of(text: &str) -> Option<u64> {
    let limit: u64 = text.trim().parse().ok()?;
    (limit < 1 << 62).then_some(limit)
}

/// Bytes for people: `512.0 GiB`, `23.1 GiB`, `640.0 MiB`, `512 bytes`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut scaled = bytes as f64 / 1024.0;
    let mut unit = 0;
    while scaled >= 1024.0 && unit + 1 < UNITS.len() {
        scaled /= 1024.0;
        unit += 1;
    }
    format!("{scaled:.1} {}", UNITS[unit])
}

/// A count with thousands separators: `180,000,000`.
pub fn format_count(count: u64) -> String {
    let digits = count.to_string();
    let mut text = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            text.push(',');
        }
        text.push(digit);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_preallocation_that_fits_is_accepted() {
        let orders = Preallocation::new("orders_max", 1 << 20, 200, "the order table");
        assert_eq!(check_fits(&[orders], GIB), Ok(()));
    }

    #[test]
    fn the_refusal_names_the_setting_value_bytes_available_and_largest_fit() {
        let orders = Preallocation::new("orders_max", 4_294_967_294, 128, "the order table");
        let text = check_fits(&[orders.as_flag()], 23 * GIB).unwrap_err();
        assert_eq!(
            text,
            "--orders-max 4294967294 needs 512.0 GiB for the order table; \
             this machine has 23.0 GiB available; at most 192,937,984 fit"
        );
    }

    #[test]
    fn the_largest_fit_leaves_room_for_the_other_settings() {
        let orders = Preallocation::new("orders_max", 1 << 30, 1024, "the order table");
        let ladders = Preallocation::new("instruments_max", 1024, 1 << 20, "the ladders");
        let text = check_fits(&[orders, ladders], 2 * GIB).unwrap_err();
        // 2 GiB less the ladders' 1 GiB leaves 1 GiB, room for 2^20 orders of 1 KiB.
        assert!(
            text.starts_with("orders_max 1073741824 needs 1.0 TiB"),
            "{text}"
        );
        assert!(
            text.contains("besides 1.0 GiB for the other capacities"),
            "{text}"
        );
        assert!(text.ends_with("at most 1,048,576 fit"), "{text}");
    }

    #[test]
    fn copies_multiply_the_bytes_and_divide_the_largest_fit() {
        let orders = Preallocation::new("orders_max", 1 << 30, 1024, "the order table").times(4);
        assert_eq!(orders.bytes(), 4 << 40);
        let text = check_fits(&[orders], 4 * GIB).unwrap_err();
        assert!(text.contains("(4 copies)"), "{text}");
        assert!(text.ends_with("at most 1,048,576 fit"), "{text}");
    }

    #[test]
    fn the_same_setting_of_several_cores_is_counted_as_copies_of_one() {
        let core = Preallocation::new("orders_max", 1 << 30, 1024, "the order table");
        let text = check_fits(&[core.clone(), core.clone(), core], 3 * GIB).unwrap_err();
        assert!(text.contains("(3 copies)"), "{text}");
        assert!(!text.contains("besides"), "{text}");
        assert!(text.ends_with("at most 1,048,576 fit"), "{text}");
    }

    #[test]
    fn bytes_past_u64_saturate_and_are_refused_without_a_panic() {
        let huge =
            Preallocation::new("orders_max", u64::MAX, u64::MAX, "the order table").times(u64::MAX);
        assert_eq!(huge.bytes(), u64::MAX);
        let other = Preallocation::new("instruments_max", u64::MAX, 2, "the ladders");
        let text = check_fits(&[huge, other], GIB).unwrap_err();
        assert!(text.ends_with("at most 0 fit"), "{text}");
    }

    #[test]
    fn meminfo_gives_mem_available_else_mem_total() {
        let full = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(meminfo_available_bytes(full), Some(20_000_000 * 1024));
        let old_kernel = "MemTotal:       24000000 kB\nMemFree:  100 kB\n";
        assert_eq!(meminfo_available_bytes(old_kernel), Some(24_000_000 * 1024));
        assert_eq!(meminfo_available_bytes("nothing here"), None);
    }

    #[test]
    fn cgroup_max_and_v1_no_limit_mean_no_limit() {
        assert_eq!(cgroup_limit_of("max\n"), None);
        assert_eq!(cgroup_limit_of("9223372036854771712\n"), None);
        assert_eq!(cgroup_limit_of("2147483648\n"), Some(2 * GIB));
    }

    #[test]
    fn bytes_and_counts_read_as_people_write_them() {
        assert_eq!(format_bytes(512), "512 bytes");
        assert_eq!(format_bytes(640 << 20), "640.0 MiB");
        assert_eq!(format_bytes(549_755_813_632), "512.0 GiB");
        assert_eq!(format_count(0), "0");
        assert_eq!(format_count(999), "999");
        assert_eq!(format_count(180_000_000), "180,000,000");
    }
}
