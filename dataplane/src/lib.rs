//! ringway's data plane: one executor per core (`executor`), each with
//! its own listeners, readiness ring, copy pools and snapshot slot.
//!
//! Layout:
//! - [`runtime`]: per-core executors, startup checks, drain.
//! - [`listeners`]: REUSEPORT listeners per core and the accept loop.
//! - [`outbound`] (15001), [`inbound_passthrough`] (15006), [`hbone::server`] (15008): the traffic paths.
//! - [`authorization`]: admission of inbound connections by policy, and late rejection.
//! - [`socks5`] (15080, off by default): SOCKS5 front door into the outbound path.
//! - [`hbone`]: HTTP/2 CONNECT over mTLS: server, client, per-core pool, stream pump.
//! - [`stream`]: async sockets on the readiness ring, for rustls and h2.
//! - [`copy`]: splice / userspace byte movement with TCP half-close and RST semantics.
//! - [`executor`]: the per-core executor (tasks, timers, cross-thread wake-ups) that sleeps on the core's ring.
//! - [`uring`]: the per-core io_uring readiness reactor every socket wait goes through.
//! - [`socket`]: SO_ORIGINAL_DST, marked connects, nonblocking syscalls.
//! - [`inpod`]: in-pod mode: pods enrolled over ZDS, listeners in their namespaces.
//! - [`netns`]: making sockets inside a pod's network namespace.
//! - [`accesslog`]: one log line per connection.
//! - [`config`]: flags and environment; executor CPUs and pinning.
//! - [`cgroup`]: the cgroup CPU quota and cpuset, read for [`config::plan_cores`].
//! - [`control`]: the control thread (config source, certificates, readiness, signals).
//! - [`app`]: wiring it together for the binary.
//! - [`allocator`]: the global allocator's counters, registered by the binary.

pub mod accesslog;
pub mod admin;
pub mod allocator;
pub mod app;
pub mod authorization;
pub mod cgroup;
pub mod config;
pub mod control;
pub mod copy;
pub mod executor;
pub mod hbone;
pub mod inbound_passthrough;
pub mod inpod;
pub mod listeners;
pub mod logfmt;
pub mod metrics;
pub mod netns;
pub mod outbound;
pub mod runtime;
pub mod socket;
pub mod socks5;
pub mod stream;
pub mod uring;
