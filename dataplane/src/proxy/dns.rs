//! The DNS proxy on a core (issue 23): the core's UDP socket and TCP
//! listener on the DNS address, answers from the core's snapshot, and the
//! names the mesh does not answer forwarded from the core's own upstream
//! socket.
//!
//! - UDP: the socket is drained with nonblocking `recv_from` until EAGAIN,
//!   then the core waits for readiness on its ring; an answer goes back
//!   with `send_to` at once, a forwarded query gets a task of its own that
//!   waits for the upstream (so one slow name never holds the others).
//! - TCP: a task per connection, 2-byte framed messages, queries answered
//!   in order, closed after `tcp_idle_timeout` without a query; at most
//!   `max_tcp_connections` per core (more are closed at once).
//! - Forwarding: the client's query leaves under a fresh random ID from one
//!   UDP socket per core and family (marked, so capture rules let it
//!   pass); the reader of that socket hands each reply to the waiting
//!   query through the core's pending table ([`forward`]). A truncated
//!   reply is asked again over TCP from the same upstream; a silent or
//!   garbled upstream passes the query to the next one. No answer by the
//!   deadline, or a full table: SERVFAIL.
//!
//! Bad input never stops a core: whatever the bytes, [`message::parse`]
//! says what to answer (FORMERR, NOTIMP, SERVFAIL) or to stay silent, and
//! each datagram or connection is handled on its own.
//!
//! In-pod mode: each enrolled pod gets its own server on each core
//! ([`DnsServer::for_pod`]), serving the sockets the manager bound in the
//! pod's namespace. The asking workload is the pod's own (the one the node
//! agent named), not a lookup by source address: every client there is
//! the pod. Forwarded queries leave from upstream sockets made in the
//! pod's namespace and marked, as ztunnel forwards a pod's queries, so
//! they reach the resolvers the pod would and the pod's DNS capture lets
//! them pass.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use ringway_controlplane::model::Workload;
use tokio::sync::oneshot;

use crate::core::CoreInputs;
use crate::dns::answer::{decide, Decision};
use crate::dns::forward::{self, Pending, PendingTable, Question, Reply};
use crate::dns::message::{self, Frame, Request, Transport};
use crate::dns::DnsProxySettings;
use crate::inpod::PodScope;
use crate::io::executor::{self, timer};
use crate::io::listener::{DnsListener, Listening};
use crate::io::socket::{self, ConnectOpts};
use crate::io::stream::{read_some, write_all};
use crate::io::uring::Registration;
use crate::telemetry::dns_metrics::{DnsLabels, DnsSeries};

thread_local! {
    /// The core's one receive buffer for every DNS socket it serves, of
    /// every pod: the largest datagram, so a query is never cut short. A
    /// datagram is read and handled before the task next waits, so the
    /// sockets share it instead of each keeping 64 KiB: three per pod and
    /// core (the listener and two upstream sockets), 384 KiB per pod on 2
    /// cores of allocations whose touched pages stay resident.
    static DATAGRAM: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; 65536].into_boxed_slice());
}

/// Runs `f` with the core's datagram buffer. `f` must not wait or come
/// back here (it runs between two awaits of one task).
fn with_datagram_buffer<T>(f: impl FnOnce(&mut [u8]) -> std::io::Result<T>) -> std::io::Result<T> {
    DATAGRAM.with_borrow_mut(|buf| f(buf))
}

/// What the upstream socket's reader hands a waiting query.
enum Upstream {
    Reply { bytes: Vec<u8>, truncated: bool },
    Garbage,
}

/// Why a forwarded query got SERVFAIL.
#[derive(Debug, Clone, Copy)]
enum Failure {
    Full,
    Send,
    Timeout,
    Garbage,
    TcpRetry,
}

impl Failure {
    fn as_str(self) -> &'static str {
        match self {
            Failure::Full => "servfail: too many queries in flight",
            Failure::Send => "servfail: cannot send upstream",
            Failure::Timeout => "servfail: upstream timeout",
            Failure::Garbage => "servfail: upstream answered garbage",
            Failure::TcpRetry => "servfail: TCP retry after truncation failed",
        }
    }
}

/// One core's DNS proxy.
pub struct DnsServer {
    core: Rc<CoreInputs>,
    settings: DnsProxySettings,
    /// The upstream sockets, by family (true: IPv6).
    upstream: HashMap<bool, Rc<UdpSocket>>,
    pending: RefCell<PendingTable<oneshot::Sender<Upstream>>>,
    rng: RefCell<fastrand::Rng>,
    tcp_open: Cell<usize>,
    /// In-pod: the pod served (its workload asks; its namespace and its
    /// removal bound the server).
    pod: Option<Rc<PodScope>>,
}

impl DnsServer {
    /// The core's DNS proxy, with its upstream sockets made (an error
    /// stops the core's startup).
    pub fn new(core: Rc<CoreInputs>, settings: DnsProxySettings) -> std::io::Result<Rc<Self>> {
        let mut upstream = HashMap::new();
        for addr in &settings.upstreams {
            if let std::collections::hash_map::Entry::Vacant(slot) = upstream.entry(addr.is_ipv6())
            {
                let fd = socket::udp_socket(*addr, core.cfg.connect.mark)?;
                slot.insert(Rc::new(UdpSocket::from(fd)));
            }
        }
        Ok(Self::build(core, settings, upstream, None))
    }

    /// One pod's DNS proxy on this core, forwarding from `upstream` (the
    /// sockets made in the pod's namespace, by family).
    pub fn for_pod(
        core: Rc<CoreInputs>,
        settings: DnsProxySettings,
        pod: Rc<PodScope>,
        upstream: Vec<(bool, OwnedFd)>,
    ) -> Rc<Self> {
        let upstream = upstream
            .into_iter()
            .map(|(v6, fd)| (v6, Rc::new(UdpSocket::from(fd))))
            .collect();
        Self::build(core, settings, upstream, Some(pod))
    }

    fn build(
        core: Rc<CoreInputs>,
        settings: DnsProxySettings,
        upstream: HashMap<bool, Rc<UdpSocket>>,
        pod: Option<Rc<PodScope>>,
    ) -> Rc<Self> {
        Rc::new(DnsServer {
            pending: RefCell::new(PendingTable::new(settings.max_pending)),
            rng: RefCell::new(fastrand::Rng::new()),
            tcp_open: Cell::new(0),
            core,
            settings,
            upstream,
            pod,
        })
    }

    /// Serves `listeners` (this core's sockets on each DNS address) and
    /// reads the upstream sockets, until the returned tasks are dropped.
    pub fn serve(self: &Rc<Self>, listeners: Vec<DnsListener>) -> Vec<executor::Task<()>> {
        let mut tasks = Vec::new();
        for sock in self.upstream.values() {
            tasks.push(executor::spawn_local(
                self.clone().read_upstream(sock.clone()),
            ));
        }
        for l in listeners {
            let udp = Rc::new(UdpSocket::from(l.udp));
            tasks.push(executor::spawn_local(self.clone().serve_udp(udp, l.addr)));
            tasks.push(executor::spawn_local(
                self.clone().accept_tcp(l.tcp, l.addr),
            ));
        }
        tasks
    }

    async fn serve_udp(self: Rc<Self>, sock: Rc<UdpSocket>, addr: SocketAddr) {
        let reg = Registration::new(&self.core.poller, sock.as_raw_fd());
        loop {
            let received = with_datagram_buffer(|buf| {
                let (n, client) = sock.recv_from(buf)?;
                self.datagram(&sock, &buf[..n], client);
                Ok(())
            });
            match received {
                Ok(()) => executor::yield_if_needed().await,
                Err(e) if socket::would_block(&e) => {
                    reg.drained();
                    if let Err(e) = reg.readable().await {
                        tracing::error!(%addr, error = %e, "DNS socket readiness failed");
                        timer::sleep(Duration::from_millis(100)).await;
                    }
                }
                // An ICMP error queued on the socket, or an interrupted call:
                // about one client or none, never a reason to stop.
                Err(e) => {
                    tracing::debug!(%addr, error = %e, "DNS receive failed");
                    executor::yield_now().await;
                }
            }
        }
    }

    /// One datagram from `client`: answered now, or forwarded on a task.
    fn datagram(self: &Rc<Self>, sock: &Rc<UdpSocket>, bytes: &[u8], client: SocketAddr) {
        match self.local(bytes, client, Transport::Udp) {
            Local::Reply(reply) => send_reply(sock, &reply, client),
            Local::Silent => {}
            Local::Forward(job) => {
                let this = self.clone();
                let sock = sock.clone();
                let query = bytes.to_vec();
                executor::spawn_detached(async move {
                    let reply = this.forward(&job, &query, Transport::Udp).await;
                    send_reply(&sock, &reply, client);
                });
            }
        }
    }

    async fn accept_tcp(self: Rc<Self>, listener: Listening, addr: SocketAddr) {
        let reg = Registration::new(&self.core.poller, listener.as_raw_fd());
        loop {
            match socket::accept(std::os::fd::AsFd::as_fd(&listener)) {
                Ok((conn, peer)) => {
                    let Some(peer) = peer else { continue };
                    if self.tcp_open.get() >= self.settings.max_tcp_connections {
                        self.core.metrics.stats.dns_tcp_refused.add(1);
                        drop(conn);
                        continue;
                    }
                    self.tcp_open.set(self.tcp_open.get() + 1);
                    let this = self.clone();
                    let mut shutdown = self.core.shutdown.clone();
                    // A removed pod's clients end with its drain.
                    let pod_closed = self.pod.as_ref().map(|p| p.closed());
                    executor::spawn_detached(async move {
                        let open = TcpSlot(this.clone());
                        let ended = async move {
                            let shutdown = async move {
                                let _ = shutdown.wait_for(|closing| *closing).await;
                            };
                            match pod_closed {
                                Some(closed) => futures_lite::future::or(shutdown, closed).await,
                                None => shutdown.await,
                            }
                        };
                        futures_lite::future::or(this.serve_tcp(conn, peer), ended).await;
                        drop(open);
                    });
                    executor::yield_if_needed().await;
                }
                Err(e) if socket::would_block(&e) => {
                    if let Err(e) = reg.ready(libc::POLLIN).await {
                        tracing::error!(%addr, error = %e, "DNS listener readiness failed");
                        timer::sleep(Duration::from_millis(100)).await;
                    }
                }
                Err(e) => {
                    tracing::debug!(%addr, error = %e, "DNS accept failed; retrying in 50ms");
                    timer::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// One TCP client: framed queries answered in order until it closes,
    /// stays idle past the timeout, or sends something unframeable.
    async fn serve_tcp(self: &Rc<Self>, conn: OwnedFd, client: SocketAddr) {
        let reg = Registration::new(&self.core.poller, conn.as_raw_fd());
        let mut stream: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; 4096];
        loop {
            while let Frame::Message { message: one, rest } = message::tcp_frame(&stream) {
                let query = one.to_vec();
                let consumed = stream.len() - rest.len();
                stream.drain(..consumed);
                let reply = match self.local(&query, client, Transport::Tcp) {
                    Local::Reply(r) => r,
                    Local::Silent => continue,
                    Local::Forward(job) => self.forward(&job, &query, Transport::Tcp).await,
                };
                let Some(framed) = message::tcp_framed(&reply) else {
                    continue;
                };
                // A client that does not read its answers is closed like
                // an idle one.
                let idle = self.settings.tcp_idle_timeout;
                if !matches!(
                    timer::timeout(idle, write_all(&reg, &framed)).await,
                    Ok(Ok(()))
                ) {
                    return;
                }
            }
            match timer::timeout(self.settings.tcp_idle_timeout, read_some(&reg, &mut chunk)).await
            {
                Ok(Ok(n)) if n > 0 => stream.extend_from_slice(&chunk[..n]),
                _ => return,
            }
        }
    }

    /// Reads one upstream socket: each reply to the query waiting for it.
    async fn read_upstream(self: Rc<Self>, sock: Rc<UdpSocket>) {
        let reg = Registration::new(&self.core.poller, sock.as_raw_fd());
        loop {
            let received = with_datagram_buffer(|buf| {
                let (n, from) = sock.recv_from(buf)?;
                Ok((n, from, self.pending.borrow_mut().reply(from, &buf[..n])))
            });
            match received {
                Ok((n, from, reply)) => {
                    match reply {
                        Reply::Answer {
                            pending,
                            bytes,
                            truncated,
                        } => {
                            let _ = pending.reply_to.send(Upstream::Reply { bytes, truncated });
                        }
                        Reply::Garbage { pending } => {
                            let _ = pending.reply_to.send(Upstream::Garbage);
                        }
                        Reply::Stray => {
                            self.core.metrics.stats.dns_stray_replies.add(1);
                            tracing::debug!(%from, bytes = n, "DNS reply matches no query in flight; dropped");
                        }
                    }
                    executor::yield_if_needed().await;
                }
                Err(e) if socket::would_block(&e) => {
                    reg.drained();
                    if let Err(e) = reg.readable().await {
                        tracing::error!(error = %e, "DNS upstream socket readiness failed");
                        timer::sleep(Duration::from_millis(100)).await;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "DNS upstream receive failed");
                    executor::yield_now().await;
                }
            }
        }
    }

    /// What the core can say about `bytes` without waiting.
    fn local(&self, bytes: &[u8], client: SocketAddr, transport: Transport) -> Local {
        let request = match message::parse(bytes) {
            Ok(r) => r,
            Err(rejection) => {
                tracing::debug!(core = self.core.index, src = %client, protocol = protocol(transport),
                    rcode = ?rejection.response_code(), "DNS query rejected");
                return match rejection.response() {
                    Some(r) => Local::Reply(r),
                    None => Local::Silent,
                };
            }
        };
        let snapshot = self.core.snapshot();
        let source = match &self.pod {
            Some(pod) => pod.workload(&snapshot).cloned(),
            None => snapshot
                .workload_by_addr(&self.core.cfg.network, client.ip().to_canonical())
                .cloned(),
        };
        let series = self.series(&request, source.as_deref(), transport);
        if let Some(s) = &series {
            s.requests.add(1);
        }
        let mut decision = decide(
            &snapshot,
            &self.settings.answers,
            source.as_deref(),
            &request.lookup_name(),
            request.family(),
        );
        drop(snapshot);
        if let Decision::Answer(answer) = &mut decision {
            answer.shuffle(&mut self.rng.borrow_mut());
        }
        match message::respond(&request, &decision, transport) {
            Some(reply) => {
                // Built only when someone reads it: most queries are answered
                // here, and the debug line is off by default.
                if tracing::enabled!(tracing::Level::DEBUG) {
                    let outcome = match &decision {
                        Decision::Answer(a) => format!("answered: {} addresses", a.addresses.len()),
                        Decision::NoData => "answered: no records of that type".into(),
                        Decision::UnknownClient => "servfail: unknown source workload".into(),
                        Decision::Forward => unreachable!("forwarded queries have no local reply"),
                    };
                    self.log(&request, client, transport, &outcome);
                }
                Local::Reply(reply)
            }
            None => Local::Forward(Job {
                request,
                client,
                series,
            }),
        }
    }

    /// Asks the upstream resolver; the reply under the client's ID, or
    /// SERVFAIL.
    async fn forward(&self, job: &Job, query: &[u8], transport: Transport) -> Vec<u8> {
        let started = Instant::now();
        if let Some(s) = &job.series {
            s.upstream_requests.add(1);
        }
        let result = self.ask_upstream(job, query, transport).await;
        if let Some(s) = &job.series {
            s.upstream_took(started.elapsed());
            if result.is_err() {
                s.upstream_failures.add(1);
            }
        }
        match result {
            Ok((reply, how)) => {
                self.log(&job.request, job.client, transport, how);
                reply
            }
            Err(why) => {
                if matches!(why, Failure::Full) {
                    self.core.metrics.stats.dns_pending_full.add(1);
                }
                self.log(&job.request, job.client, transport, why.as_str());
                message::error_response(&job.request, ResponseCode::ServFail)
            }
        }
    }

    /// Asks the upstreams in order until one answers: each gets an equal
    /// share of the time left (the last all of it), so one silent server
    /// does not use up the client's wait; one that cannot be sent to or
    /// answers garbage passes to the next at once.
    async fn ask_upstream(
        &self,
        job: &Job,
        query: &[u8],
        transport: Transport,
    ) -> Result<(Vec<u8>, &'static str), Failure> {
        let deadline = Instant::now() + self.settings.timeout;
        let upstreams = &self.settings.upstreams;
        let mut failure = Failure::Send;
        for (i, &upstream) in upstreams.iter().enumerate() {
            let left = deadline.saturating_duration_since(Instant::now());
            let share = left / u32::try_from(upstreams.len() - i).unwrap_or(u32::MAX);
            let attempt = Attempt {
                upstream,
                wait_until: Instant::now() + share,
                deadline,
            };
            match self.ask_one(attempt, job, query, transport).await {
                Ok(answer) => return Ok(answer),
                Err(Failure::Full) => return Err(Failure::Full),
                Err(why) => failure = why,
            }
        }
        Err(failure)
    }

    /// One upstream's turn: its UDP reply by `wait_until`, and the TCP
    /// retry after truncation by the query's `deadline`.
    async fn ask_one(
        &self,
        attempt: Attempt,
        job: &Job,
        query: &[u8],
        transport: Transport,
    ) -> Result<(Vec<u8>, &'static str), Failure> {
        let Attempt {
            upstream,
            wait_until,
            deadline,
        } = attempt;
        let sock = self
            .upstream
            .get(&upstream.is_ipv6())
            .ok_or(Failure::Send)?;
        let question = Question::of(&job.request);
        let (tx, rx) = oneshot::channel();
        let id = self
            .pending
            .borrow_mut()
            .insert(
                &mut self.rng.borrow_mut(),
                Pending {
                    upstream,
                    client_id: job.request.id(),
                    question: question.clone(),
                    reply_to: tx,
                },
            )
            .map_err(|_| Failure::Full)?;
        // Whatever ends the wait (reply, timeout, the client's task
        // dropped), the query leaves the table.
        let _entry = Forget(&self.pending, id);
        sock.send_to(&forward::with_id(query, id), upstream)
            .map_err(|_| Failure::Send)?;
        let got = timer::timeout(wait_until.saturating_duration_since(Instant::now()), rx).await;
        match got {
            Ok(Ok(Upstream::Reply {
                bytes,
                truncated: false,
            })) => Ok((bytes, "forwarded")),
            Ok(Ok(Upstream::Reply {
                bytes: cut,
                truncated: true,
            })) => {
                let left = deadline.saturating_duration_since(Instant::now());
                let full = timer::timeout(left, self.ask_tcp(upstream, query, &question, job))
                    .await
                    .map_err(|_| Failure::Timeout)?
                    .ok_or(Failure::TcpRetry)?;
                // A UDP client that cannot take the whole answer gets the
                // upstream's truncated one, and asks again over TCP.
                if transport == Transport::Udp
                    && full.len() > usize::from(job.request.udp_payload())
                {
                    return Ok((cut, "forwarded: truncated, client to retry over TCP"));
                }
                Ok((full, "forwarded: over TCP after truncation"))
            }
            Ok(Ok(Upstream::Garbage)) => Err(Failure::Garbage),
            Ok(Err(_)) | Err(_) => Err(Failure::Timeout),
        }
    }

    /// The query again over TCP to `upstream` (after a truncated reply),
    /// under a fresh ID; None if it fails or the reply is not the answer.
    async fn ask_tcp(
        &self,
        upstream: SocketAddr,
        query: &[u8],
        question: &Question,
        job: &Job,
    ) -> Option<Vec<u8>> {
        let opts = ConnectOpts {
            mark: self.core.cfg.connect.mark,
            timeout: self.settings.timeout,
            keepalive: None,
        };
        let netns = self.pod.as_ref().map(|p| p.netns());
        let conn = socket::connect_from(&self.core.poller, upstream, opts, None, netns)
            .await
            .ok()?;
        let reg = Registration::new(&self.core.poller, conn.as_raw_fd());
        let id = self.rng.borrow_mut().u16(..);
        let framed = message::tcp_framed(&forward::with_id(query, id))?;
        write_all(&reg, &framed).await.ok()?;
        let mut stream = Vec::new();
        let mut chunk = vec![0u8; 4096];
        loop {
            if let Frame::Message { message: one, .. } = message::tcp_frame(&stream) {
                return forward::tcp_reply(one, id, question, job.request.id());
            }
            let n = read_some(&reg, &mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            stream.extend_from_slice(&chunk[..n]);
        }
    }

    fn series(
        &self,
        request: &Request,
        source: Option<&Workload>,
        transport: Transport,
    ) -> Option<Arc<DnsSeries>> {
        self.core.metrics.dns.series(&DnsLabels {
            query_type: &request.query_type(),
            protocol: protocol(transport),
            canonical_service: source.map_or("", |w| &w.canonical_name),
            canonical_revision: source.map_or("", |w| &w.canonical_revision),
        })
    }

    fn log(&self, request: &Request, client: SocketAddr, transport: Transport, outcome: &str) {
        tracing::debug!(
            core = self.core.index,
            src = %client,
            name = %request.name(),
            qtype = %request.query_type(),
            protocol = protocol(transport),
            outcome,
            "DNS query"
        );
    }
}

/// One upstream's turn at a forwarded query.
struct Attempt {
    upstream: SocketAddr,
    /// When its UDP reply is given up on.
    wait_until: Instant,
    /// When the client gets SERVFAIL whatever happens.
    deadline: Instant,
}

/// A query the mesh does not answer, on its way upstream.
struct Job {
    request: Request,
    client: SocketAddr,
    series: Option<Arc<DnsSeries>>,
}

enum Local {
    Reply(Vec<u8>),
    Silent,
    Forward(Job),
}

/// Removes a forwarded query from the pending table when its wait ends
/// without a reply. Only if the entry is still this query's: a reply
/// already took it out, and its ID may since have gone to another query,
/// whose waiter is still there.
struct Forget<'a>(&'a RefCell<PendingTable<oneshot::Sender<Upstream>>>, u16);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0
            .borrow_mut()
            .remove_if(self.1, |p| p.reply_to.is_closed());
    }
}

/// Counts a TCP client against the core's cap while it is served.
struct TcpSlot(Rc<DnsServer>);

impl Drop for TcpSlot {
    fn drop(&mut self) {
        self.0.tcp_open.set(self.0.tcp_open.get().saturating_sub(1));
    }
}

fn protocol(transport: Transport) -> &'static str {
    match transport {
        Transport::Udp => "udp",
        Transport::Tcp => "tcp",
    }
}

/// UDP: a reply that cannot go out now (a full socket buffer) is dropped;
/// the client asks again.
fn send_reply(sock: &UdpSocket, reply: &[u8], client: SocketAddr) {
    if let Err(e) = sock.send_to(reply, client) {
        tracing::debug!(%client, error = %e, "DNS reply not sent");
    }
}

/// The upstream resolvers when none are given: resolv.conf's.
pub fn system_upstreams() -> Vec<SocketAddr> {
    let conf = std::fs::read_to_string(forward::RESOLV_CONF).unwrap_or_default();
    forward::nameservers(&conf)
}
