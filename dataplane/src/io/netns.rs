//! Making sockets inside another network namespace (in-pod mode). A socket
//! belongs to the namespace its creator thread was in at `socket(2)`, and
//! stays there whatever the thread does next; so the thread steps into the
//! pod's namespace (`setns`), creates the socket, and steps back. Only the
//! calling thread moves: the other cores are not affected.
//!
//! Needs CAP_SYS_ADMIN (setns into a namespace this process did not
//! create), as ztunnel does.

use std::cell::OnceCell;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

thread_local! {
    /// This thread's own namespace, opened before it first leaves it.
    static HOME: OnceCell<OwnedFd> = const { OnceCell::new() };
}

fn setns(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: setns on a descriptor we borrow; it only changes this thread's
    // network namespace.
    if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Runs `f` (socket creation and setup, nothing that waits) with this
/// thread in the network namespace `ns`, then returns to the thread's own.
/// An error entering says why (not a network namespace, no CAP_SYS_ADMIN).
///
/// The way back is a guard, taken also if `f` panics. If the thread cannot
/// return, the process aborts: a core left in a pod's namespace would make
/// every later socket there, for every pod and for node-level traffic, and
/// a panic would not stop it (the executor catches a task's panic and the
/// core goes on).
pub fn within<T>(ns: BorrowedFd<'_>, f: impl FnOnce() -> T) -> io::Result<T> {
    HOME.with(|home| -> io::Result<T> {
        if home.get().is_none() {
            let own: OwnedFd = std::fs::File::open("/proc/thread-self/ns/net")?.into();
            let _ = home.set(own);
        }
        let home = home.get().expect("set above");
        setns(ns).map_err(|e| {
            let hint = match e.raw_os_error() {
                Some(libc::EINVAL) => " (the descriptor is not a network namespace)",
                Some(libc::EPERM) => " (needs CAP_SYS_ADMIN)",
                _ => "",
            };
            io::Error::new(
                e.kind(),
                format!("cannot enter the pod's network namespace: {e}{hint}"),
            )
        })?;
        let _back = ReturnHome(home.as_fd());
        Ok(f())
    })
}

/// Steps the thread back into its own namespace when dropped.
struct ReturnHome<'a>(BorrowedFd<'a>);

impl Drop for ReturnHome<'_> {
    fn drop(&mut self) {
        if let Err(e) = setns(self.0) {
            // No logging here: the writer may be what failed. stderr is
            // unbuffered and reaches the container log.
            eprintln!("ringway: cannot return to its own network namespace: {e}; aborting");
            std::process::abort();
        }
    }
}

/// The identity of a namespace descriptor (device and inode): equal means
/// the same namespace.
pub fn id(ns: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let dup = ns.try_clone_to_owned()?;
    let m = std::fs::File::from(dup).metadata()?;
    Ok((m.dev(), m.ino()))
}

/// Whether `ns` is this process's own network namespace (a node agent that
/// hands ringway its own namespace, or the host's, as a pod's would have
/// ringway capture itself).
pub fn is_own(ns: BorrowedFd<'_>) -> io::Result<bool> {
    let own = std::fs::File::open("/proc/self/ns/net")?;
    Ok(id(ns)? == id(own.as_fd())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A descriptor that is not a namespace is refused with the reason,
    /// and the thread stays where it was.
    #[test]
    fn not_a_namespace_is_a_clear_error() {
        let before = id(std::fs::File::open("/proc/thread-self/ns/net")
            .unwrap()
            .as_fd())
        .unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        let err = within(file.as_fd(), || ()).unwrap_err().to_string();
        assert!(
            err.contains("not a network namespace") || err.contains("CAP_SYS_ADMIN"),
            "{err}"
        );
        let after = id(std::fs::File::open("/proc/thread-self/ns/net")
            .unwrap()
            .as_fd())
        .unwrap();
        assert_eq!(before, after);
    }

    /// Entering our own namespace and coming back works and runs `f` once.
    #[test]
    fn round_trip_through_a_namespace() {
        let own = std::fs::File::open("/proc/self/ns/net").unwrap();
        let mut runs = 0;
        within(own.as_fd(), || runs += 1).unwrap_or_else(|e| {
            // Without CAP_SYS_ADMIN (tests as non-root) setns is refused.
            assert!(e.to_string().contains("CAP_SYS_ADMIN"), "{e}");
            runs = 1;
        });
        assert_eq!(runs, 1);
    }
}
