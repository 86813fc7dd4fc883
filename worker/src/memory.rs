//! Giving freed heap memory back to the operating system.
//!
//! glibc keeps memory freed by a thread in that thread's arena for reuse by the same arena only,
//! and mid-heap free space is never returned on its own. Loading a model leaves hundreds of MB of
//! such space behind (file buffers, weights before they were transposed), which the training
//! threads cannot reuse: without a trim it stays resident for the life of the process.

/// Returns the free memory of every malloc arena to the OS (glibc `malloc_trim`); a no-op with
/// other C libraries. Cheap next to what precedes its calls (a model load, a training step).
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: malloc_trim only walks glibc's own arenas under their locks.
        unsafe {
            malloc_trim(0);
        }
    }
}
