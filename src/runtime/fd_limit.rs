//! The open-file limit, raised at start from its soft value to its hard one (as Go's runtime
//! does for every program, and nginx's `worker_rlimit_nofile` for its workers). Every client
//! connection and every upstream connection is a descriptor, and each HTTP/2 stream waiting on
//! an upstream holds one of its own: under systemd's default soft limit of 1024, five HTTP/2
//! clients with 200 streams each on a slow upstream used every descriptor, and the gateway
//! stopped accepting while its open connections got 502s.

#![allow(unsafe_code)]

use std::io;

/// A hard limit of "unlimited" is taken as this many (Linux's default `fs.nr_open`).
const UNLIMITED_AS: u64 = 1 << 20;

/// Raise the soft limit to the hard one: `(before, after)`.
pub(super) fn raise() -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable `rlimit` for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    let want = if lim.rlim_max == libc::RLIM_INFINITY {
        UNLIMITED_AS
    } else {
        lim.rlim_max
    };
    if before != libc::RLIM_INFINITY && before < want {
        lim.rlim_cur = want;
        // SAFETY: `lim` is a valid `rlimit`; a soft limit at most the hard one is allowed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok((before, lim.rlim_cur))
}
