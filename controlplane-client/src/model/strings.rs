//! [`Str`], the model's string type, and [`intern`].
//!
//! A mesh of 100k workloads repeats a few thousand strings (namespaces,
//! service accounts, trust domains, nodes, networks, clusters, service
//! keys) hundreds of thousands of times. Held as `String`s each copy cost
//! 24 bytes inline plus its own allocation. [`Str`] is `arcstr::ArcStr`:
//! one pointer wide, immutable, refcounted, with the empty string and
//! literals held statically; [`intern`] hands every caller that asks for
//! the same text the same allocation. Sources intern the fields that
//! repeat across workloads and keep unique ones (uids, pod names) as plain
//! [`Str`]s.
//!
//! The interner is process-wide and used by config sources on the control
//! thread only; cores read [`Str`]s and never intern. Strings nobody holds
//! any more are dropped from it as it grows ([`intern`] sweeps when the set
//! has doubled since the last sweep), so a churning mesh does not leak.

use std::sync::Mutex;

use hashbrown::HashSet;

/// An immutable, cheaply cloned string: 8 bytes, refcounted.
pub type Str = arcstr::ArcStr;

/// A slice of a [`Str`] that shares its allocation: 16 bytes. What a
/// workload's name is, since Kubernetes uids end with it
/// (`<cluster>//Pod/<ns>/<name>`); see [`name_within`].
pub type SubStr = arcstr::Substr;

/// `name` as a slice of `uid` when `uid` ends with `/<name>` (Istio's uids
/// for pods and workload entries do), so the two share one allocation;
/// otherwise a string of its own.
pub fn name_within(uid: &Str, name: &str) -> SubStr {
    let (Some(start), true) = (uid.len().checked_sub(name.len()), uid.ends_with(name)) else {
        return SubStr::from(name);
    };
    if !name.is_empty() && uid[..start].ends_with('/') {
        uid.substr(start..)
    } else {
        SubStr::from(name)
    }
}

struct Interner {
    set: HashSet<Str, foldhash::fast::FixedState>,
    /// Sweep when the set reaches this size.
    sweep_at: usize,
}

static INTERNER: Mutex<Option<Interner>> = Mutex::new(None);

/// Sweeps start at this many strings.
const FIRST_SWEEP: usize = 4096;

/// The shared copy of `s`. The empty string is static and never stored.
pub fn intern(s: &str) -> Str {
    if s.is_empty() {
        return Str::new();
    }
    // A poisoned lock only means another thread panicked mid-insert; the
    // set is still a valid set.
    let mut guard = INTERNER.lock().unwrap_or_else(|e| e.into_inner());
    let interner = guard.get_or_insert_with(|| Interner {
        set: HashSet::with_hasher(foldhash::fast::FixedState::default()),
        sweep_at: FIRST_SWEEP,
    });
    if let Some(existing) = interner.set.get(s) {
        return existing.clone();
    }
    if interner.set.len() >= interner.sweep_at {
        // Held by the set alone: nobody uses it any more.
        interner.set.retain(|s| Str::strong_count(s) != Some(1));
        interner.set.shrink_to_fit();
        interner.sweep_at = (interner.set.len() * 2).max(FIRST_SWEEP);
    }
    let new = Str::from(s);
    interner.set.insert(new.clone());
    new
}

/// [`intern`] for an owned string.
pub fn intern_owned(s: String) -> Str {
    intern(&s)
}

/// How many strings the interner holds (for tests and accounting).
pub fn interned_len() -> usize {
    INTERNER
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map_or(0, |i| i.set.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_text_same_allocation() {
        let a = intern("ns-intern-test");
        let b = intern(&String::from("ns-intern-test"));
        assert!(Str::ptr_eq(&a, &b));
        assert_eq!(a, "ns-intern-test");
        let empty = intern("");
        assert!(empty.is_empty());
        assert_eq!(std::mem::size_of::<Str>(), 8);
    }

    #[test]
    fn a_name_shares_its_uid() {
        let uid = Str::from("Kubernetes//Pod/shop/cart-7d9f8c6b5-x2x4z");
        let name = name_within(&uid, "cart-7d9f8c6b5-x2x4z");
        assert_eq!(name, "cart-7d9f8c6b5-x2x4z");
        assert!(Str::ptr_eq(name.parent(), &uid));
        // Not a whole trailing segment, not a suffix, empty: its own copy.
        for other in ["x2x4z", "cart", ""] {
            let n = name_within(&uid, other);
            assert_eq!(n, other);
            assert!(!Str::ptr_eq(n.parent(), &uid));
        }
        assert_eq!(name_within(&Str::from("a"), "long-name"), "long-name");
    }

    #[test]
    fn unused_strings_are_swept() {
        // Fill past a sweep point with strings nobody keeps.
        for i in 0..(FIRST_SWEEP * 3) {
            drop(intern(&format!("sweep-test-{i}")));
        }
        let kept = intern("sweep-test-kept");
        for i in 0..(FIRST_SWEEP * 3) {
            drop(intern(&format!("sweep-test-b-{i}")));
        }
        // Other tests intern concurrently, so only bound the size loosely:
        // without sweeping it would hold 6 × FIRST_SWEEP strings.
        assert!(interned_len() < FIRST_SWEEP * 5, "{}", interned_len());
        assert!(Str::ptr_eq(&kept, &intern("sweep-test-kept")));
    }
}
