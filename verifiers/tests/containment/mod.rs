//! What the sandbox suites share: how long containment may take and how to look for processes
//! that outlived a run.

use std::time::Duration;

/// Far above every limit the suites use: a run that needs this long was not contained.
pub const CONTAINED_WITHIN: Duration = Duration::from_secs(60);

/// Host processes whose command line contains `marker`.
pub fn host_processes_containing(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read(e.path().join("cmdline"))
                        .map(|c| String::from_utf8_lossy(&c).contains(marker))
                        .unwrap_or(false)
                })
                .count()
        })
        .unwrap_or(0)
}

/// Waits (up to 10 s) until no host process contains `marker`; returns how many are left.
pub fn processes_left_after_waiting(marker: &str) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while host_processes_containing(marker) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    host_processes_containing(marker)
}
