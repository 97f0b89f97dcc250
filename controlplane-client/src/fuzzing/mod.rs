//! The fuzz harnesses of the control-plane side (issue 25, item 6): what
//! `fuzz/fuzz_targets/*` call with libFuzzer's bytes, and what the stable
//! replay test (`dataplane/tests/fuzz_corpus.rs`) runs the committed corpus
//! through, so CI exercises the same code without nightly.
//!
//! Not an API: `#[doc(hidden)]`, kept in the crate so each fuzz target is
//! one line and both callers run the same code. Each harness panics when an
//! invariant breaks; that panic is the fuzzer's crash. Each also has its
//! seeds: real, valid inputs to start a run from.
//!
//! - [`xds`]: `istio.workload.Address` and `istio.security.Authorization`
//!   bytes through the conversion to the model and into a snapshot.
//! - [`local`]: LOCAL_XDS YAML through the loader.
//! - [`authz`]: policies and a connection drawn from the bytes, compiled
//!   and decided, held against the reference evaluator.
//! - [`zds`]: packets from the node agent through the ZDS request handling.
//!
//! May use the [`model`](crate::model) and [`sources`](crate::sources).

pub mod authz;
pub mod local;
pub mod xds;
pub mod zds;

/// Draws choices from the fuzzer's bytes, front to back; past the end every
/// draw is 0 (the first choice), so any input means something.
pub struct Draw<'a> {
    data: &'a [u8],
}

impl<'a> Draw<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Draw { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub fn bit(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.byte(), self.byte()])
    }

    /// A number below `n` (which must not be 0).
    pub fn below(&mut self, n: usize) -> usize {
        usize::from(self.byte()) % n
    }

    /// One of `from` (which must not be empty).
    pub fn pick<T: Clone>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())].clone()
    }

    /// The next `n` bytes (fewer at the end).
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (taken, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        taken
    }

    /// Up to `max` bytes, as many as the next byte says.
    pub fn bytes(&mut self, max: usize) -> &'a [u8] {
        let n = self.below(max + 1);
        self.take(n)
    }

    /// A short string: usually one of `pool`, sometimes raw bytes (lossy).
    pub fn text(&mut self, pool: &[&str]) -> String {
        let choice = self.below(pool.len() + 1);
        match pool.get(choice) {
            Some(s) => (*s).to_owned(),
            None => String::from_utf8_lossy(self.bytes(24)).into_owned(),
        }
    }
}
