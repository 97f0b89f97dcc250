//! ringway's data plane: one executor per core, each with its own
//! listeners, io_uring, copy pools, HBONE pool and snapshot slot.
//!
//! Layers, lowest first; a module imports only from its own layer and the
//! ones below it (`tests/layering.rs` checks it):
//! - [`io`]: the per-core executor and its io_uring, sockets, streams, the
//!   splice copy, network namespaces, listeners, counters.
//! - [`dns`]: the DNS proxy's answers from the mesh snapshot and its wire
//!   format (no sockets yet).
//! - [`inpod`]: in-pod mode: pods enrolled over ZDS, their listeners in
//!   their namespaces, and what a core keeps per pod.
//! - [`telemetry`]: metrics, the access log and its formats, the admin
//!   endpoint, the side ports' HTTP server.
//! - [`hbone`]: the HBONE protocol: HTTP/2 settings and the stream pump,
//!   the client and its per-core pool, the per-core certificates.
//! - [`core`]: the per-core context every path reads, its settings, and
//!   inbound authorization with late rejection.
//! - [`proxy`]: the traffic paths, one module each (15001, 15006, 15008,
//!   15080, the same-node fast path), and their accept loop.
//! - [`app`]: the binary's wiring: command line, core planning, startup
//!   checks, the executors, the control thread.

pub mod app;
pub mod core;
pub mod dns;
pub mod hbone;
pub mod inpod;
pub mod io;
pub mod proxy;
pub mod telemetry;
