//! Returning freed memory to the system once a job is over. While a job runs, the process keeps
//! the blocks it frees for reuse (the CLI's malloc policy: a training step frees and allocates
//! the same megabytes many times); after the job, that memory would stay resident until another
//! job needed it, so a finished job's weights, optimizer state and activations kept counting
//! against the machine in `verity up` beside the inference engine and the API.

/// Hands the heap's free memory back to the system (glibc's `malloc_trim`); whether any was.
pub fn release_freed_memory() -> bool {
    trim()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() -> bool {
    // SAFETY: malloc_trim only returns free heap pages to the kernel, under malloc's own locks;
    // it never touches memory in use.
    unsafe { libc::malloc_trim(0) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}
