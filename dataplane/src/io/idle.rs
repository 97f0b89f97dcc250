//! The idle bound of a proxied connection (`--idle-timeout`): a
//! connection that moved no byte either way for the bound is dropped.
//!
//! Cheap by construction: the byte movers already count every byte into
//! the connection's two [`ByteCount`]s, so nothing is re-armed per byte.
//! A watch wakes every quarter of the bound on the core's timers (an
//! ordered map in the executor, no system call of its own) and compares
//! the counts with what it saw last; a connection is cut between 1× and
//! 1.25× the bound after its last byte. Off (the default), a connection
//! holds one empty pointer for it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::io::count::ByteCount;
use crate::io::executor::timer;

/// How often the watch looks, as a fraction of the bound.
const CHECKS_PER_BOUND: u32 = 4;

/// Completes once neither count moved for `bound`; with no bound, never.
pub struct Quiet<'a>(Option<Pin<Box<dyn Future<Output = ()> + 'a>>>);

impl<'a> Quiet<'a> {
    pub fn new(bound: Option<Duration>, counts: [&'a ByteCount; 2]) -> Self {
        Quiet(bound.map(|b| Box::pin(watch(b, counts)) as Pin<Box<dyn Future<Output = ()>>>))
    }
}

impl Future for Quiet<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.0 {
            Some(w) => w.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}

async fn watch(bound: Duration, counts: [&ByteCount; 2]) {
    let step = (bound / CHECKS_PER_BOUND).max(Duration::from_millis(1));
    let total = || counts[0].get() + counts[1].get();
    let (mut seen, mut since) = (total(), Instant::now());
    loop {
        timer::sleep(step).await;
        let now = total();
        if now != seen {
            (seen, since) = (now, Instant::now());
        } else if since.elapsed() >= bound {
            return;
        }
    }
}

/// Runs `carried` (a connection's byte moving) until it ends (Some), or
/// until `quiet` completes first (None: `carried` is dropped, which closes
/// what it owns). A combinator rather than an `async` block: a block would
/// keep `carried` twice (as captured, and as awaited) for the connection's
/// life.
pub struct UntilIdle<'a, F> {
    carried: F,
    quiet: Quiet<'a>,
}

/// `carried` bounded by `quiet` (see [`UntilIdle`]).
pub fn until_idle<F: Future>(carried: F, quiet: Quiet<'_>) -> UntilIdle<'_, F> {
    UntilIdle { carried, quiet }
}

impl<F: Future> Future for UntilIdle<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `carried` is pinned structurally: it is never moved out
        // of `self` (no method hands it out, there is no Drop impl), so the
        // pin of `self` extends to it. `quiet` is Unpin and not pinned.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: as above; `this.carried` stays where it is until dropped.
        let carried = unsafe { Pin::new_unchecked(&mut this.carried) };
        if let Poll::Ready(v) = carried.poll(cx) {
            return Poll::Ready(Some(v));
        }
        match Pin::new(&mut this.quiet).poll(cx) {
            Poll::Ready(()) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::executor::Builder;

    /// A quiet pair is cut after the bound (and not before); one whose
    /// bytes keep moving outlives several bounds; with no bound, nothing.
    #[test]
    fn only_a_connection_with_no_byte_either_way_is_cut() {
        let bound = Duration::from_millis(200);
        let (quiet_after, busy_cut, unbounded_cut) = Builder::new("idle-test")
            .spawn(move || async move {
                let (a, b) = (ByteCount::default(), ByteCount::default());
                let start = Instant::now();
                let cut = until_idle(
                    std::future::pending::<()>(),
                    Quiet::new(Some(bound), [&a, &b]),
                );
                assert!(cut.await.is_none());
                let quiet_after = start.elapsed();

                // One direction moving a byte every 50 ms for 1 s.
                let (c, d) = (ByteCount::default(), ByteCount::default());
                let moving = async {
                    for _ in 0..20 {
                        timer::sleep(Duration::from_millis(50)).await;
                        d.add(1);
                    }
                };
                let busy = until_idle(moving, Quiet::new(Some(bound), [&c, &d]));
                let busy_cut = busy.await.is_none();

                let none = until_idle(
                    timer::sleep(Duration::from_millis(600)),
                    Quiet::new(None, [&c, &d]),
                );
                (quiet_after, busy_cut, none.await.is_none())
            })
            .expect("executor")
            .join()
            .expect("executor ran");
        assert!(
            quiet_after >= bound && quiet_after < bound * 2,
            "cut after {quiet_after:?} for a {bound:?} bound"
        );
        assert!(!busy_cut, "a connection moving bytes was cut");
        assert!(!unbounded_cut, "cut with no bound");
    }
}
