//! Log lines in ztunnel's two shapes, so that log pipelines, dashboards and
//! queries written for ztunnel read ringway's lines unchanged:
//!
//! - JSON: `{"level":"info","time":"…Z","scope":"access","message":"connection complete","src.addr":…}`
//! - text: `time<TAB>level<TAB>scope<TAB>message<TAB>key=value key="string" …`
//!
//! The scope is the event's target without the crate prefix (`access`,
//! `authz`, `app`, `sources::xds`, …).

use std::fmt::{self, Write as _};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Lines dropped because the writer fell behind.
static DROPPED: AtomicUsize = AtomicUsize::new(0);

/// Lines dropped so far because the writer fell behind.
pub fn dropped_lines() -> usize {
    DROPPED.load(Ordering::Relaxed)
}

/// Where log lines go: a bounded queue that cores push formatted lines
/// into, and a writer thread of its own that writes them to stdout in
/// batches.
///
/// Pushing never blocks and never wakes anyone: the writer does not wait
/// on the queue (a waiting receiver would be woken, with a futex call,
/// for every line) but looks every 2 ms while lines come and up to every
/// 50 ms when idle, and writes what it finds with one `write` per batch.
/// A full queue drops the line and counts it (`dropped_lines`).
pub struct LogQueue {
    tx: crossbeam_channel::Sender<Vec<u8>>,
}

/// Stops the writer after it wrote what is queued (at exit).
pub struct LogWriterGuard {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for LogWriterGuard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl LogQueue {
    /// A queue of `lines` and its writer thread, writing to `out`.
    pub fn start(
        lines: usize,
        out: impl Write + Send + 'static,
    ) -> std::io::Result<(LogQueue, LogWriterGuard)> {
        let (tx, rx) = crossbeam_channel::bounded::<Vec<u8>>(lines.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ringway-log".into())
            .spawn(move || write_batches(rx, out, &stopping))?;
        Ok((
            LogQueue { tx },
            LogWriterGuard {
                stop,
                thread: Some(thread),
            },
        ))
    }
}

fn write_batches(rx: crossbeam_channel::Receiver<Vec<u8>>, out: impl Write, stop: &AtomicBool) {
    const BUSY: Duration = Duration::from_millis(2);
    const IDLE: Duration = Duration::from_millis(50);
    let mut out = std::io::BufWriter::with_capacity(256 << 10, out);
    let mut pause = BUSY;
    loop {
        let stopping = stop.load(Ordering::Acquire);
        let mut wrote = false;
        while let Ok(line) = rx.try_recv() {
            // A failing stdout (closed pipe) loses lines, never a core.
            let _ = out.write_all(&line);
            wrote = true;
        }
        if wrote {
            let _ = out.flush();
        }
        if stopping {
            return;
        }
        pause = if wrote { BUSY } else { (pause * 2).min(IDLE) };
        std::thread::park_timeout(pause);
    }
}

/// One event's line, handed to the queue whole.
pub struct QueueLine<'a>(&'a LogQueue);

impl Write for QueueLine<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.tx.try_send(buf.to_vec()).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogQueue {
    type Writer = QueueLine<'a>;

    fn make_writer(&'a self) -> QueueLine<'a> {
        QueueLine(self)
    }
}

/// Reads, and with a new spec replaces, the log filter at runtime: the
/// admin endpoint's `/logging`. Returns the filter now in force.
pub type FilterControl = Box<dyn Fn(Option<&str>) -> Result<String, String> + Send + Sync>;

static FILTER: OnceLock<FilterControl> = OnceLock::new();

/// Registers the filter control (once, at startup).
pub fn set_filter_control(control: FilterControl) {
    let _ = FILTER.set(control);
}

/// The filter in force, after applying `spec` (`info`, `access=warn,debug`,
/// ...) if given.
pub fn log_filter(spec: Option<&str>) -> Result<String, String> {
    match FILTER.get() {
        Some(f) => f(spec),
        None => Err("logging is not set up".into()),
    }
}

/// The event formatter: JSON or text, both as ztunnel writes them.
pub struct ZtunnelFormat {
    pub json: bool,
}

fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

/// The event's target as a ztunnel scope: crate prefixes dropped.
fn scope(target: &str) -> &str {
    for prefix in ["ringway_dataplane::", "ringway_controlplane::", "ringway::"] {
        if let Some(rest) = target.strip_prefix(prefix) {
            return rest;
        }
    }
    target
}

impl<S, N> FormatEvent<S, N> for ZtunnelFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut time = String::with_capacity(32);
        SystemTime.format_time(&mut Writer::new(&mut time))?;
        let mut fields = Fields {
            json: self.json,
            message: String::new(),
            rest: String::with_capacity(256),
        };
        event.record(&mut fields);
        let (level, scope) = (level_name(meta.level()), scope(meta.target()));
        if self.json {
            write!(w, "{{\"level\":\"{level}\",\"time\":\"{time}\",\"scope\":")?;
            json_string(&mut w, scope)?;
            w.write_str(",\"message\":")?;
            json_string(&mut w, &fields.message)?;
            w.write_str(&fields.rest)?;
            w.write_str("}\n")
        } else {
            write!(w, "{time}\t{level}\t{scope}\t{}", fields.message)?;
            if !fields.rest.is_empty() {
                write!(w, "\t{}", fields.rest)?;
            }
            w.write_char('\n')
        }
    }
}

/// Collects an event's message and its other fields, already rendered in
/// the output's syntax (`,"k":v` for JSON, `k=v` separated by spaces for
/// text).
struct Fields {
    json: bool,
    message: String,
    rest: String,
}

impl Fields {
    fn key(&mut self, field: &Field) {
        if self.json {
            self.rest.push(',');
            let _ = json_string(&mut self.rest, field.name());
            self.rest.push(':');
        } else {
            if !self.rest.is_empty() {
                self.rest.push(' ');
            }
            self.rest.push_str(field.name());
            self.rest.push('=');
        }
    }

    /// A value that is a number or a boolean in both syntaxes.
    fn raw(&mut self, field: &Field, value: impl fmt::Display) {
        self.key(field);
        let _ = write!(self.rest, "{value}");
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
            return;
        }
        self.key(field);
        if self.json {
            let _ = json_string(&mut self.rest, value);
        } else {
            let _ = write!(self.rest, "{value:?}");
        }
    }

    /// Display (`%x`) and Debug (`?x`) values: bare in text, as ztunnel
    /// writes addresses; strings in JSON.
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
            return;
        }
        self.key(field);
        if self.json {
            let _ = json_string(&mut self.rest, &format!("{value:?}"));
        } else {
            let _ = write!(self.rest, "{value:?}");
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.raw(field, value)
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.raw(field, value)
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.raw(field, value)
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        if value.is_finite() {
            self.raw(field, value)
        } else {
            self.record_debug(field, &value)
        }
    }
}

/// Writes `s` as a JSON string literal.
fn json_string(w: &mut impl fmt::Write, s: &str) -> fmt::Result {
    w.write_char('"')?;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let escaped = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            c if (c as u32) < 0x20 => {
                w.write_str(&s[start..i])?;
                write!(w, "\\u{:04x}", c as u32)?;
                start = i + c.len_utf8();
                continue;
            }
            _ => continue,
        };
        w.write_str(&s[start..i])?;
        w.write_str(escaped)?;
        start = i + c.len_utf8();
    }
    w.write_str(&s[start..])?;
    w.write_char('"')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Buf {
            self.clone()
        }
    }

    fn capture(json: bool, emit: impl FnOnce()) -> String {
        let buf = Buf::default();
        let subscriber = tracing_subscriber::fmt()
            .event_format(ZtunnelFormat { json })
            .with_writer(buf.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = buf.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    fn access_line() {
        let addr: std::net::SocketAddr = "10.0.0.1:4000".parse().unwrap();
        let none: Option<&str> = None;
        tracing::event!(
            target: "access",
            Level::ERROR,
            {
                src.addr = %addr,
                src.workload = none,
                src.identity = "spiffe://td/ns/a/sa/b",
                bytes_sent = 5u64,
                error = "a \"quoted\"\nreason"
            },
            "connection complete"
        );
    }

    #[test]
    fn json_has_ztunnels_keys_and_escapes_strings() {
        let out = capture(true, access_line);
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
        assert_eq!(v["level"], "error");
        assert_eq!(v["scope"], "access");
        assert_eq!(v["message"], "connection complete");
        assert_eq!(v["src.addr"], "10.0.0.1:4000");
        assert_eq!(v["src.identity"], "spiffe://td/ns/a/sa/b");
        assert_eq!(v["bytes_sent"], 5);
        assert_eq!(v["error"], "a \"quoted\"\nreason");
        assert!(
            v.get("src.workload").is_none(),
            "absent values are omitted: {v}"
        );
        assert!(v["time"].as_str().unwrap().ends_with('Z'), "{v}");
    }

    #[test]
    fn text_is_tab_separated_with_quoted_strings() {
        let out = capture(false, access_line);
        let parts: Vec<&str> = out.trim_end().split('\t').collect();
        assert_eq!(parts.len(), 5, "{out}");
        assert_eq!(&parts[1..4], ["error", "access", "connection complete"]);
        assert_eq!(
            parts[4],
            "src.addr=10.0.0.1:4000 src.identity=\"spiffe://td/ns/a/sa/b\" bytes_sent=5 \
             error=\"a \\\"quoted\\\"\\nreason\""
        );
    }

    /// Lines come out whole and in order, and the guard writes what is
    /// still queued; a full queue drops and counts instead of waiting.
    #[test]
    fn the_queue_writes_in_order_and_drops_when_full() {
        let out = Buf::default();
        let (queue, guard) = LogQueue::start(4, out.clone()).unwrap();
        let dropped = dropped_lines();
        {
            use tracing_subscriber::fmt::MakeWriter;
            for i in 0..10 {
                let _ = queue
                    .make_writer()
                    .write_all(format!("line {i}\n").as_bytes());
            }
        }
        drop(guard);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(!lines.is_empty() && lines.len() <= 10, "{text}");
        let mut expected = 0;
        for l in &lines {
            let n: usize = l.strip_prefix("line ").unwrap().parse().unwrap();
            assert!(n >= expected, "out of order: {text}");
            expected = n + 1;
        }
        // Whatever did not fit was counted (other tests' loggers may add).
        assert!(dropped_lines() - dropped >= 10 - lines.len(), "{text}");
    }

    #[test]
    fn scope_drops_crate_prefixes_only() {
        assert_eq!(scope("ringway_dataplane::app"), "app");
        assert_eq!(scope("ringway_controlplane::sources::xds"), "sources::xds");
        assert_eq!(scope("access"), "access");
        assert_eq!(scope("h2::proto"), "h2::proto");
    }
}
