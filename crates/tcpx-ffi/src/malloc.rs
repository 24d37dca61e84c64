//! glibc's malloc under an address-space limit (`ulimit -v`).
//!
//! glibc gives threads that contend for the allocator arenas of their own, and each arena
//! reserves 64 MiB of address space up front (up to 8 per core). Under `RLIMIT_AS` a handful of
//! such reservations uses the whole limit, and then a 1-byte allocation fails and the process
//! aborts, however little memory it actually holds. Capping the arenas keeps the limit for what
//! the process really allocates.

/// The soft `RLIMIT_AS` in bytes, `None` when unlimited (or unreadable).
pub fn address_space_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into the valid, writable struct it is given.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) };
    (rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// Under an address-space limit, caps glibc's malloc arenas at `arenas` (at least 1) so that
/// per-thread arena reservations cannot use up the limit; returns the limit when it capped.
/// Does nothing without a limit (arenas spare contended threads a lock) or off glibc.
pub fn cap_malloc_arenas_under_address_limit(arenas: u32) -> Option<u64> {
    let limit = address_space_limit()?;
    let n = arenas.clamp(1, 64) as libc::c_int;
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a tunable of glibc's allocator; M_ARENA_MAX takes any positive
    // count at any time (glibc reads it under its arena lock when it would make a new arena).
    let took = unsafe { libc::mallopt(libc::M_ARENA_MAX, n) } == 1;
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let took = {
        let _ = n;
        false
    };
    took.then_some(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_reads_as_the_process_has_it_and_nothing_is_capped_without_one() {
        // The test process runs without `ulimit -v` (CI and the VM): unlimited reads as None,
        // and the cap then does nothing.
        if address_space_limit().is_none() {
            assert_eq!(cap_malloc_arenas_under_address_limit(2), None);
        }
    }
}
