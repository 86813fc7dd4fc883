//! The process's malloc policy. Training allocates and frees tensors of megabytes many times a
//! step; glibc serves those from fresh `mmap`s and unmaps them on free, so every step pays page
//! faults, page zeroing and cross-CPU TLB shootdowns (~10 % of a training step on a 2-core VM).
//! Raising the mmap threshold and keeping freed memory lets the heap reuse it instead.

/// Variables with which a user sets glibc's malloc policy; any of them leaves it alone.
const USER_SETTINGS: [&str; 4] =
    ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES"];

/// Largest block served from the heap rather than its own mapping (glibc's maximum).
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free memory kept at the top of the heap before it is returned to the system.
const TRIM_THRESHOLD: i32 = i32::MAX;
/// Extra memory requested whenever the heap grows.
const TOP_PAD: i32 = 256 << 20;

/// What [`retain_freed_memory`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocatorPolicy {
    /// The heap keeps and reuses freed blocks up to [`MMAP_THRESHOLD`].
    Retaining,
    /// The user's own malloc settings are in force.
    UserSettings,
    /// Not glibc: nothing to do.
    Unsupported,
}

/// Makes glibc's malloc keep and reuse freed memory, unless the user configured malloc.
pub fn retain_freed_memory() -> AllocatorPolicy {
    if USER_SETTINGS.iter().any(|name| std::env::var_os(name).is_some()) {
        return AllocatorPolicy::UserSettings;
    }
    apply()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() -> AllocatorPolicy {
    // SAFETY: mallopt only changes malloc's parameters; it takes malloc's own lock.
    let applied = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
            && libc::mallopt(libc::M_TOP_PAD, TOP_PAD) == 1
    };
    if applied {
        AllocatorPolicy::Retaining
    } else {
        AllocatorPolicy::Unsupported
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() -> AllocatorPolicy {
    AllocatorPolicy::Unsupported
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_accepts_the_policy() {
        let expected = if cfg!(all(target_os = "linux", target_env = "gnu")) {
            AllocatorPolicy::Retaining
        } else {
            AllocatorPolicy::Unsupported
        };
        if USER_SETTINGS.iter().all(|name| std::env::var_os(name).is_none()) {
            assert_eq!(retain_freed_memory(), expected);
            // Blocks under the threshold now come from the heap and are reused once freed.
            let first = vec![1u8; 8 << 20];
            let address = first.as_ptr() as usize;
            drop(first);
            let second = vec![2u8; 8 << 20];
            if expected == AllocatorPolicy::Retaining {
                assert_eq!(second.as_ptr() as usize, address, "a freed 8 MiB block is reused");
            }
        }
    }
}
