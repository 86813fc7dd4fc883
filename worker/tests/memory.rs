//! A finished job's memory goes back to the system: under the malloc policy the `verity` binary
//! sets (freed blocks kept for reuse, never trimmed), memory freed stays resident until
//! `release_freed_memory` hands it back. Its own binary without the test harness: it changes the
//! process's malloc policy, reads its RSS, and allocates on the main thread (the main arena,
//! whose heap top `malloc_trim` returns; see docs/operations.md).

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn main() {
    use verity_worker::memory::release_freed_memory;
    const MIB: usize = 1 << 20;
    /// Resident bytes of this process.
    fn rss() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        // SAFETY: sysconf only reads a constant of the system.
        pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize
    }
    // The CLI's policy (cli/src/allocator.rs): blocks up to 32 MiB from the heap, never trimmed.
    // SAFETY: mallopt only changes malloc's parameters, under malloc's own lock.
    unsafe {
        assert_eq!(libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20), 1);
        assert_eq!(libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX), 1);
    }
    let before = rss();
    let blocks: Vec<Vec<u8>> = (0..48).map(|i| vec![i as u8 | 1; MIB]).collect();
    assert!(blocks.iter().all(|b| b[MIB - 1] != 0));
    drop(blocks);
    let kept = rss();
    assert!(kept > before + 32 * MIB, "freed memory kept: {before} -> {kept}");
    assert!(release_freed_memory(), "malloc_trim released nothing");
    let after = rss();
    assert!(after + 32 * MIB < kept, "handed back: {kept} -> {after}");
    println!("memory_kept_for_reuse_is_handed_back: {kept} -> {after} bytes resident ... ok");
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn main() {
    println!("memory_kept_for_reuse_is_handed_back: not glibc, nothing to hand back ... ok");
}
