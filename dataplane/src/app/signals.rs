//! Which threads see SIGTERM and SIGINT: the control thread only.

/// SIGTERM/SIGINT must reach the control thread only: delivered to a core
/// thread they would interrupt its io_uring calls (EINTR) for nothing.
/// Threads inherit the mask, so block here before any thread starts; the
/// control thread unblocks them for itself.
pub fn set_termination_signals_blocked(blocked: bool) {
    // SAFETY: sigset_t is a plain bit set; sigemptyset initialises it
    // before anything reads it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    let how = if blocked {
        libc::SIG_BLOCK
    } else {
        libc::SIG_UNBLOCK
    };
    // SAFETY: `set` is a valid, writable sigset_t; SIGTERM and SIGINT are
    // valid signal numbers; pthread_sigmask reads `set` and writes no old
    // mask (null).
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}
