//! I/O plumbing below every traffic path: the per-core executor and its
//! io_uring, sockets and the async streams rustls and h2 run on, the byte
//! movers, network namespaces, listeners and the counts kept as bytes
//! move. Nothing here knows the mesh; it imports nothing else of the
//! crate.
//!
//! - [`executor`]: the per-core executor (tasks, timers, cross-thread
//!   wake-ups) that sleeps on the core's ring.
//! - [`uring`]: the per-core io_uring readiness reactor every socket wait
//!   goes through.
//! - [`socket`]: SO_ORIGINAL_DST, marked connects, nonblocking syscalls.
//! - [`stream`]: async sockets on the readiness ring, for rustls and h2.
//! - [`copy`]: splice / userspace byte movement with TCP half-close and
//!   RST semantics.
//! - [`sockmap`]: the in-kernel redirect (BPF sockmap) that passthrough
//!   connections can be handed to once set up.
//! - [`netns`]: making sockets inside a pod's network namespace.
//! - [`listener`]: REUSEPORT listeners, bound per core on the main thread.
//! - [`reuseport`]: a closing listener's queued connections handed to the
//!   port's other listeners (the next proxy's, at an upgrade).
//! - [`count`]: core-local counters: bytes moved, things open.
//! - [`idle`]: the idle bound of a proxied connection, read off its counts.
//! - [`latch`]: a core-local one-shot signal (drain, pod removal).
//! - [`sockmap`]: the kernel side of the in-kernel passthrough redirect
//!   (BPF sockmap), and [`redirect`]: a core driving it.

pub mod copy;
pub mod count;
pub mod executor;
pub mod idle;
pub mod latch;
pub mod listener;
pub mod netns;
pub mod redirect;
pub mod reuseport;
pub mod socket;
pub mod sockmap;
pub mod stream;
pub mod uring;
