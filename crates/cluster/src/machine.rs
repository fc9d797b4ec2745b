//! The machine's memory, for the capacity check of `bourse_engine::capacity`: the engine does
//! no I/O, so what the machine can give is read here, by the processes that start cores.

use bourse_engine::capacity::{
    cgroup_limit_of, check_fits, meminfo_available_bytes, Preallocation,
};

/// As [`check_fits`] against the memory this machine can give ([`available_bytes`]); without
/// a figure for it (not Linux, or /proc unreadable) nothing is refused, as before the check.
pub fn check_fits_machine(preallocations: &[Preallocation]) -> Result<(), String> {
    match available_bytes() {
        Some(available) => check_fits(preallocations, available),
        None => Ok(()),
    }
}

/// The memory this process can count on now, in bytes: the kernel's estimate of what can be
/// given without swapping (`MemAvailable`, or `MemTotal` on kernels before 3.14), lowered to
/// the limit of the process's memory cgroup when one is set. `None` off Linux or when
/// /proc/meminfo cannot be read.
pub fn available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let machine = meminfo_available_bytes(&meminfo)?;
    Some(match cgroup_limit_bytes() {
        Some(limit) => machine.min(limit),
        None => machine,
    })
}

/// The memory limit of the process's cgroup, v2 (`memory.max`) or v1
/// (`memory/memory.limit_in_bytes`), as the container sees its own cgroup at the root. The
/// limit is used whole, not less the group's current usage: that usage counts page cache
/// the kernel reclaims on demand, and subtracting it would refuse sizes that fit.
fn cgroup_limit_bytes() -> Option<u64> {
    [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|path| std::fs::read_to_string(path).ok())
    .and_then(|text| cgroup_limit_of(&text))
}
