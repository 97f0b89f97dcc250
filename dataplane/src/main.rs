//! The `ringway` binary.

use std::process::ExitCode;

/// jemalloc, not glibc malloc: the HBONE path frees and re-allocates
/// frame-sized buffers (h2 reads each DATA frame into fresh memory) at
/// line rate; glibc returns that memory to the kernel and page-faults it
/// back in, jemalloc keeps it. Measured: ~20 % less CPU per GiB of HBONE
/// (`ringway-perf`; docs/performance/vs-direct.md, "What moved HBONE").
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's run-time settings, read at its initialisation (the
/// `_RJEM_MALLOC_CONF` environment variable still overrides them):
///
/// * `background_thread:true,max_background_threads:1`: one jemalloc
///   thread gives freed pages back to the system as they decay (after
///   10 s unused). Without it, pages decay only while the thread that
///   freed them keeps allocating: after ringway loads a config (the YAML
///   parser needs several times what the snapshot keeps), that thread goes
///   quiet and ~160 MiB stayed resident for good at 100k workloads
///   (`scale-bench`). The thread sleeps while nothing is left to purge.
#[used]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: &[u8; 48] = b"background_thread:true,max_background_threads:1\0";

/// jemalloc's counters for the admin endpoint's `/memory`.
mod jemalloc {
    use std::ffi::CString;
    use std::os::raw::c_void;

    use serde_json::{json, Value};
    use tikv_jemalloc_sys::mallctl;

    /// Reads the mallctl `name` as a `T` (size_t, ssize_t, unsigned, bool).
    fn read<T: Copy + Default>(name: &str) -> Option<T> {
        let name = CString::new(name).ok()?;
        let mut value = T::default();
        let mut len = std::mem::size_of::<T>();
        // SAFETY: `value` is a valid, writable `T` of `len` bytes, which is
        // the size the named mallctl reads into (size_t, ssize_t, unsigned
        // or bool, as the callers below ask for).
        let rc = unsafe {
            mallctl(
                name.as_ptr(),
                (&mut value as *mut T).cast::<c_void>(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        (rc == 0 && len == std::mem::size_of::<T>()).then_some(value)
    }

    /// Refreshes jemalloc's cached counters ("epoch"), then reads them.
    /// Bytes unless said otherwise; null where jemalloc was built without
    /// statistics.
    pub fn stats() -> Value {
        let mut epoch: u64 = 1;
        let mut len = std::mem::size_of::<u64>();
        // SAFETY: writing "epoch" takes a u64 and reads back into one.
        unsafe {
            mallctl(
                c"epoch".as_ptr(),
                (&mut epoch as *mut u64).cast::<c_void>(),
                &mut len,
                (&mut epoch as *mut u64).cast::<c_void>(),
                std::mem::size_of::<u64>(),
            );
        }
        let bytes = |name: &str| read::<usize>(name);
        let page = bytes("arenas.page").unwrap_or(4096);
        // MALLCTL_ARENAS_ALL: every arena merged.
        let pages = |what: &str| bytes(&format!("stats.arenas.4096.{what}")).map(|p| p * page);
        json!({
            "allocator": "jemalloc",
            "allocated": bytes("stats.allocated"),
            "active": bytes("stats.active"),
            "metadata": bytes("stats.metadata"),
            "resident": bytes("stats.resident"),
            "mapped": bytes("stats.mapped"),
            "retained": bytes("stats.retained"),
            "dirty": pages("pdirty"),
            "muzzy": pages("pmuzzy"),
            "arenas": read::<u32>("arenas.narenas"),
            "background_thread": read::<bool>("background_thread"),
            "dirty_decay_ms": read::<isize>("arenas.dirty_decay_ms"),
            "muzzy_decay_ms": read::<isize>("arenas.muzzy_decay_ms"),
        })
    }

    /// `arena.<MALLCTL_ARENAS_ALL>.purge`: every unused dirty and muzzy page
    /// of every arena back to the system.
    pub fn purge() {
        // SAFETY: a "void" mallctl: no old or new value.
        unsafe {
            mallctl(
                c"arena.4096.purge".as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            );
        }
    }
}

use clap::{CommandFactory, FromArgMatches};
use ringway_dataplane::app::cli::{CertCommand, Cli, Command, LogFormat};
use ringway_dataplane::app::ztunnel_env::{self, Notice};
use ringway_dataplane::telemetry::logfmt;
use tracing_subscriber::EnvFilter;

/// Log lines in ztunnel's shapes (see `logfmt`), written by a thread of
/// their own: each core only formats a line and queues it (bounded, lossy:
/// a full queue drops the line and counts it), so a slow or stalled stdout
/// never blocks a data-plane core. The guard writes what is queued at exit.
fn init_logging(format: LogFormat, queued_lines: usize) -> Option<logfmt::LogWriterGuard> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = matches!(format, LogFormat::Json);
    let (writer, guard) = match logfmt::LogQueue::start(queued_lines, std::io::stdout()) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("ringway: cannot start the log writer thread: {e}");
            return None;
        }
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .event_format(logfmt::ZtunnelFormat { json })
        .with_writer(writer)
        .with_filter_reloading();
    let handle = builder.reload_handle();
    builder.init();
    // The admin endpoint's /logging: read or replace the filter.
    logfmt::set_filter_control(Box::new(move |spec| {
        if let Some(spec) = spec {
            let filter = EnvFilter::try_new(spec).map_err(|e| format!("{e}"))?;
            handle.reload(filter).map_err(|e| format!("{e}"))?;
        }
        handle
            .with_current(|f| f.to_string())
            .map_err(|e| format!("{e}"))
    }));
    Some(guard)
}

fn main() -> ExitCode {
    ringway_dataplane::telemetry::allocator::install(
        ringway_dataplane::telemetry::allocator::Hooks {
            stats: jemalloc::stats,
            purge: jemalloc::purge,
        },
    );
    let cmd = Cli::command().after_help(ztunnel_env::help_text());
    let matches = cmd.clone().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // ztunnel's variables beside ringway's flags, before logging starts:
    // LOG_FORMAT is one of them.
    let env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let ztunnel = match cli.command {
        None => ztunnel_env::apply(&cmd, &matches, &mut cli.run, &env),
        Some(_) => Ok(Vec::new()),
    };
    let _log_writer = init_logging(cli.run.log_format, cli.run.log_queue_lines as usize);
    let ztunnel = ztunnel.map(|notices| {
        for notice in notices {
            match notice {
                Notice::Warn(m) => tracing::warn!("{m}"),
                Notice::Info(m) => tracing::info!("{m}"),
            }
        }
    });
    let result = match cli.command {
        None => ztunnel.and_then(|()| ringway_dataplane::app::run(cli.run)),
        Some(Command::Cert(CertCommand::Issue {
            spiffe_id,
            ca_dir,
            out,
            ttl,
        })) => ringway_dataplane::app::issue_cert(&spiffe_id, &ca_dir, &out, ttl),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("ringway: {e:#}");
            ExitCode::FAILURE
        }
    }
}
