//! Smoke test of every scenario with tiny sizes against the in-process
//! server, directly and through a SOCKS5 relay: bytes arrive and the
//! numbers are sane (finite, positive). Nothing here is timed.

use std::net::SocketAddr;
use std::time::Duration;

use ringway_perf::dial::Dialer;
use ringway_perf::procstat::Processes;
use ringway_perf::rr::Limit;
use ringway_perf::throughput::Direction;
use ringway_perf::{connect, idle, rr, rr_conc, scenario::Scenario, server, socks5, throughput};

fn sane(x: f64, what: &str) {
    assert!(x.is_finite() && x > 0.0, "{what} = {x}");
}

fn routes() -> Vec<(&'static str, Dialer)> {
    let target = server::spawn(&["127.0.0.1:0".parse().unwrap()]).unwrap()[0];
    let relay = socks5::spawn_relay("127.0.0.1:0".parse().unwrap()).unwrap();
    vec![
        ("direct", Dialer::direct(target)),
        ("socks5", Dialer::via_socks5(target, relay)),
        // From an explicit source address, as the rig does.
        (
            "socks5 bound",
            Dialer::via_socks5(target, relay).bind(Some("127.0.0.1".parse().unwrap())),
        ),
    ]
}

/// The relay runs in this process, so this process stands in for "the
/// proxy" when CPU and memory are charged.
fn me() -> Processes {
    Processes::new(vec![std::process::id()])
}

#[test]
fn throughput_moves_every_byte_each_way() {
    for (name, d) in routes() {
        for dir in [Direction::Up, Direction::Down, Direction::Both] {
            let r = throughput::run(
                &d,
                throughput::Params {
                    streams: 3,
                    bytes_per_stream: 1 << 20,
                    direction: dir,
                },
                &me(),
            )
            .unwrap_or_else(|e| panic!("{name} {dir:?}: {e}"));
            let per = if dir == Direction::Both { 2 } else { 1 };
            assert_eq!(r.bytes, 3 * (1 << 20) * per, "{name} {dir:?}");
            sane(r.gbit_per_s, "Gbit/s");
            sane(r.seconds, "seconds");
            let cpu = r.proxy_cpu_s_per_gib.expect("charged to this process");
            assert!(cpu.is_finite() && cpu >= 0.0);
        }
    }
}

#[test]
fn throughput_without_proxy_reports_no_cpu() {
    let target = server::spawn(&["127.0.0.1:0".parse().unwrap()]).unwrap()[0];
    let r = throughput::run(
        &Dialer::direct(target),
        throughput::Params {
            streams: 1,
            bytes_per_stream: 4096,
            direction: Direction::Up,
        },
        &Processes::default(),
    )
    .unwrap();
    assert_eq!(r.proxy_cpu_s_per_gib, None);
}

#[test]
fn rr_by_count_and_by_duration() {
    for (name, d) in routes() {
        let r = rr::run(
            &d,
            rr::Params {
                size: 100,
                connections: 3,
                limit: Limit::Count(301),
            },
            &me(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        // Histograms of all three connections merged: every request counted.
        assert_eq!(r.requests, 301, "{name}");
        assert_eq!(r.latency.count, 301);
        sane(r.requests_per_s, "req/s");
        let l = &r.latency;
        for (p, v) in l.points() {
            sane(v, p);
        }
        assert!(l.p50_us <= l.p90_us && l.p90_us <= l.p99_us && l.p99_us <= l.max_us);
        assert!(r.proxy_cpu_s_per_1k_requests.unwrap().is_finite());

        let r = rr::run(
            &d,
            rr::Params {
                size: 1,
                connections: 1,
                limit: Limit::Duration(Duration::from_millis(100)),
            },
            &Processes::default(),
        )
        .unwrap();
        assert!(r.requests > 0);
        assert!(r.seconds >= 0.1);
        assert_eq!(r.proxy_cpu_s_per_1k_requests, None);
    }
}

#[test]
fn rr_conc_by_count_and_by_duration() {
    for (name, d) in routes() {
        // More connections than threads, a count that does not divide
        // evenly: every request is answered and counted exactly once.
        let r = rr_conc::run(
            &d,
            rr_conc::Params {
                size: 100,
                connections: 7,
                threads: 2,
                limit: Limit::Count(1001),
            },
            &me(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.requests, 1001, "{name}");
        assert_eq!(r.latency.count, 1001);
        assert_eq!(r.threads, 2);
        assert_eq!(r.requests_per_thread, [501, 500]);
        sane(r.requests_per_s, "req/s");
        for (p, v) in r.latency.points() {
            sane(v, p);
        }
        let l = &r.latency;
        assert!(l.p50_us <= l.p99_us && l.p99_us <= l.max_us);
        assert!(r.proxy_cpu_ms_per_1k_requests.unwrap().is_finite());
        assert!(r.client_cpu_s > 0.0 && r.client_busy.is_finite());

        // By duration, more threads asked for than connections: one each.
        let r = rr_conc::run(
            &d,
            rr_conc::Params {
                size: 1,
                connections: 3,
                threads: 8,
                limit: Limit::Duration(Duration::from_millis(100)),
            },
            &Processes::default(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.threads, 3);
        assert!(r.requests_per_thread.iter().all(|&n| n > 0), "{r:?}");
        assert!(r.seconds >= 0.1);
        assert_eq!(r.proxy_cpu_ms_per_1k_requests, None);
    }
}

#[test]
fn rr_conc_requests_larger_than_the_socket_buffers() {
    // 8 MiB each way: a request cannot be written in one go, so the client
    // waits for writability in between; every byte is still accounted.
    let (_, d) = routes().remove(0);
    let r = rr_conc::run(
        &d,
        rr_conc::Params {
            size: 8 << 20,
            connections: 2,
            threads: 1,
            limit: Limit::Count(6),
        },
        &Processes::default(),
    )
    .unwrap();
    assert_eq!(r.requests, 6);
    assert_eq!(r.requests_per_thread, [6]);
}

#[test]
fn rr_conc_needs_connections_and_bytes() {
    let (_, d) = routes().remove(0);
    for (size, connections) in [(0, 1), (1, 0)] {
        let e = rr_conc::run(
            &d,
            rr_conc::Params {
                size,
                connections,
                threads: 1,
                limit: Limit::Count(1),
            },
            &Processes::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("rr-conc needs"), "{e}");
    }
}

#[test]
fn connect_counts_connections_and_errors() {
    for (name, d) in routes() {
        let r = connect::run(
            &d,
            connect::Params {
                concurrency: 2,
                limit: Limit::Count(50),
            },
            &me(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.connections, 50, "{name}");
        assert_eq!(r.errors, 0, "{name}: {:?}", r.first_error);
        sane(r.connections_per_s, "conn/s");
        sane(r.connect_to_first_byte.p50_us, "p50");
    }
    // Nobody listens: every attempt fails, the scenario reports why.
    let closed: SocketAddr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let e = connect::run(
        &Dialer::direct(closed),
        connect::Params {
            concurrency: 1,
            limit: Limit::Count(3),
        },
        &Processes::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("refused"), "{e}");
}

#[test]
fn idle_holds_connections_and_measures_memory() {
    for (name, d) in routes() {
        let r = idle::run(
            &d,
            idle::Params {
                connections: 20,
                settle: Duration::from_millis(10),
            },
            &me(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.connections, 20);
        assert!(r.proxy_rss_open.unwrap() > 0);
        // Memory may even shrink in between (other tests free theirs).
        assert!(r.proxy_bytes_per_connection.unwrap().is_finite());
        assert!(r.open_seconds > 0.0);
    }
}

#[test]
fn suite_scenarios_yield_their_metrics() {
    let (_, d) = routes().remove(1);
    let cases = [
        (
            Scenario::Throughput(throughput::Params {
                streams: 2,
                bytes_per_stream: 1 << 16,
                direction: Direction::Up,
            }),
            vec!["throughput.2.up.gbps", "throughput.2.up.cpu_per_gib"],
        ),
        (
            Scenario::Rr(rr::Params {
                size: 1,
                connections: 1,
                limit: Limit::Count(20),
            }),
            vec![
                "rr.rps",
                "rr.p50",
                "rr.p90",
                "rr.p99",
                "rr.p999",
                "rr.max",
                "rr.cpu_per_1k",
            ],
        ),
        (
            Scenario::RrConc(rr_conc::Params {
                size: 1,
                connections: 4,
                threads: 2,
                limit: Limit::Count(40),
            }),
            vec![
                "rr-conc.4.rps",
                "rr-conc.4.cpu_ms_per_1k",
                "rr-conc.4.p50",
                "rr-conc.4.p99",
                "rr-conc-generator.4",
            ],
        ),
        (
            Scenario::Connect(connect::Params {
                concurrency: 1,
                limit: Limit::Count(5),
            }),
            vec![
                "connect.cps",
                "connect.p50",
                "connect.max",
                "connect.cpu_per_1k",
            ],
        ),
        (
            Scenario::Idle(idle::Params {
                connections: 3,
                settle: Duration::ZERO,
            }),
            vec!["idle.kib_per_conn", "idle.rss_open_mib", "idle.cpu_per_1k"],
        ),
    ];
    for (s, want) in cases {
        let m = s.run(&d, &me()).unwrap();
        let ids: Vec<&str> = m.metrics.iter().map(|(d, _)| d.id.as_str()).collect();
        for w in want {
            assert!(ids.contains(&w), "{}: {w} missing from {ids:?}", s.label());
        }
        for (def, v) in &m.metrics {
            assert!(v.is_finite(), "{}: {v}", def.id);
        }
        assert!(m.raw.is_object());
    }
}
