use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::*;

fn run<T: Send + 'static, F: Future<Output = T> + 'static>(
    f: impl FnOnce() -> F + Send + 'static,
) -> T {
    Builder::new("executor-test")
        .spawn(f)
        .expect("executor")
        .join()
        .expect("executor ran")
}

/// Every awaited task needs the executor to run a queued task; it must
/// never sleep while one is runnable (glommio 0.9.0 did, which stalled
/// HBONE tunnels for seconds: issue 10).
#[test]
fn never_sleeps_with_a_runnable_task() {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let _core = Builder::new("runnable").spawn(move || async move {
        for i in 0..10_000u32 {
            assert_eq!(spawn_local(async move { i }).await, i);
        }
        let _ = done_tx.send(());
    });
    done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the executor slept with a runnable task");
}

/// A waker used on another thread wakes a sleeping core: the control
/// thread's snapshot feed does exactly this.
#[test]
fn a_wake_from_another_thread_reaches_a_sleeping_core() {
    let (tx, rx) = tokio::sync::watch::channel(0u32);
    let sender = std::thread::spawn(move || {
        for v in 1..=200 {
            std::thread::sleep(Duration::from_micros(300));
            tx.send(v).unwrap();
        }
        tx
    });
    let last = run(move || async move {
        let mut rx = rx;
        let mut last = 0;
        while last < 200 {
            timer::timeout(Duration::from_secs(5), rx.changed())
                .await
                .expect("a remote wake was lost: the core slept through it")
                .expect("sender alive");
            last = *rx.borrow_and_update();
        }
        last
    });
    assert_eq!(last, 200);
    drop(sender.join());
}

/// Timers fire no earlier than asked, in deadline order, and a timeout
/// ends a future that never completes.
#[test]
fn timers_fire_in_order_and_not_early() {
    let order = run(|| async {
        let order = Rc::new(RefCell::new(Vec::new()));
        let start = Instant::now();
        let tasks: Vec<_> = [30u64, 10, 20, 0]
            .into_iter()
            .map(|ms| {
                let order = order.clone();
                spawn_local(async move {
                    timer::sleep(Duration::from_millis(ms)).await;
                    assert!(
                        start.elapsed() >= Duration::from_millis(ms),
                        "{ms} ms timer fired early"
                    );
                    order.borrow_mut().push(ms);
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
        let never = std::future::pending::<()>();
        let t0 = Instant::now();
        assert_eq!(
            timer::timeout(Duration::from_millis(15), never).await,
            Err(timer::TimedOut)
        );
        assert!(t0.elapsed() >= Duration::from_millis(15));
        let v = order.borrow().clone();
        v
    });
    assert_eq!(order, vec![0, 10, 20, 30]);
}

/// Dropping a task's handle cancels it: its future is dropped and never
/// polled again. A task spawned detached runs on.
#[test]
fn dropping_a_handle_cancels_and_a_detached_task_runs_on() {
    run(|| async {
        struct Flag(Rc<Cell<bool>>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.set(true);
            }
        }
        let dropped = Rc::new(Cell::new(false));
        let ran_on = Rc::new(Cell::new(false));
        let t = {
            let flag = Flag(dropped.clone());
            let ran_on = ran_on.clone();
            spawn_local(async move {
                let _flag = flag;
                timer::sleep(Duration::from_millis(20)).await;
                ran_on.set(true);
            })
        };
        yield_now().await;
        drop(t);
        assert!(dropped.get(), "cancel must drop the future at once");
        let handleless = Rc::new(Cell::new(false));
        {
            let handleless = handleless.clone();
            spawn_detached(async move {
                timer::sleep(Duration::from_millis(5)).await;
                handleless.set(true);
            });
        }
        // Timers fire in deadline order however loaded the machine: by the
        // time this 40 ms one does, the 5 ms and 20 ms ones have had their
        // turn, so this is no race with the scheduler.
        timer::sleep(Duration::from_millis(40)).await;
        assert!(!ran_on.get(), "a cancelled task ran");
        assert!(handleless.get(), "a detached task did not run");
    });
}

/// A long loop that calls yield_if_needed lets other tasks (and the ring)
/// in at least every few milliseconds.
#[test]
fn yield_if_needed_gives_way_to_other_tasks() {
    run(|| async {
        let ticks = Rc::new(Cell::new(0u32));
        let ticker = {
            let ticks = ticks.clone();
            spawn_local(async move {
                loop {
                    ticks.set(ticks.get() + 1);
                    yield_now().await;
                }
            })
        };
        // Each round keeps the pass busy past PREEMPT_AFTER (a loaded
        // machine only makes the pass longer), so yield_if_needed must give
        // way, and the other task runs before this one goes on. Counted in
        // rounds, not in wall time: a descheduled thread loses no round.
        for round in 0..20 {
            let seen = ticks.get();
            let spin = Instant::now();
            while spin.elapsed() < PREEMPT_AFTER * 2 {}
            yield_if_needed().await;
            assert!(
                ticks.get() > seen,
                "round {round}: a pass busy for {:?} did not give way",
                spin.elapsed()
            );
        }
        drop(ticker);
    });
}

/// A panic in a connection's (detached) task ends that task only: the
/// core keeps running its other tasks, counts the panic, and drops the
/// task's state (its destructors run).
#[test]
fn a_panicking_detached_task_ends_alone() {
    struct Dropped(std::sync::mpsc::Sender<&'static str>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            let _ = self.0.send("dropped");
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let panics = run(move || async move {
        let guard = Dropped(tx);
        spawn_detached(async move {
            let _guard = guard;
            timer::sleep(Duration::from_millis(5)).await;
            panic!("boom in a connection");
        });
        // Another connection, and the core's own work, go on. Its 20 ms
        // timer fires after the panicking task's 5 ms one whatever the load
        // (timers fire in deadline order), so the panic has happened by then.
        let other = spawn_local(async {
            timer::sleep(Duration::from_millis(20)).await;
            7
        });
        assert_eq!(other.await, 7);
        task_panics()
    });
    assert_eq!(panics, 1);
    assert_eq!(rx.try_recv(), Ok("dropped"), "its state was dropped");
}
