//! [`Table`]: the persistent hash index behind every [`Snapshot`] map.
//!
//! # Why not `imbl::HashMap`
//!
//! A persistent HAMT (`imbl`) makes an update O(log n), but every lookup
//! walks 3–4 dependent node pointers, and its fixed-size sparse nodes cost a
//! lot of memory. Measured on 100k entries keyed by 45-char strings (uids),
//! random keys that hit, ns per lookup with hot and cold caches (x86-64,
//! release, 2-core machine):
//!
//! | map | hot | cold | bytes/entry |
//! |---|---:|---:|---:|
//! | `std::HashMap`, SipHash (the snapshot before deltas) | 53 | 240 | 89 |
//! | `imbl::HashMap`, SipHash | 100–166 | – | 242 |
//! | `imbl::HashMap`, foldhash | 52–63 | 182 | 242 |
//! | this `Table`, foldhash, key inside the value | 36–42 | 141 | 12 |
//!
//! By IP, `imbl` took 40–46 ns (SipHash) or 18–23 ns (foldhash) where std
//! took 15, at 197 bytes per entry against 43. Clone + one insert: ~2.5 µs
//! for either persistent map.
//!
//! Lookups are the data path (one or more per connection); updates are the
//! control thread's, a few per second. So the index is a fixed array of
//! [`SHARDS`] ordinary SwissTables (`hashbrown::HashTable`), each behind its
//! own `Arc`. A lookup is one hash, one array index and one SwissTable probe,
//! no allocation; with foldhash rather than SipHash it beats the std maps
//! the snapshot used before (snapshot-bench, 100k pods, hot / cold caches:
//! `workload_by_addr` 19 / 36 ns against 34–43 / 95–129, `endpoints` 17 /
//! 19 ns against 38 / 99–118). A new version clones the shard array (256
//! pointer copies) and, copy-on-write, only the shards it touches (~n/256
//! entries each), so a one-item update costs a few µs at 100k entries and
//! versions share every untouched shard. The table stores values whose key
//! lives inside them (`Arc<Workload>` is keyed by its own `uid`), so most
//! indexes cost ~8–32 bytes per entry.
//!
//! The shard is the top byte of the hash times an odd constant: it depends
//! on every bit of the hash (foldhash's middle bits alone spread structured
//! keys such as sequential IPs badly for some seeds), and within a shard the
//! bits hashbrown uses (low bits for the bucket, top 7 for the control byte)
//! stay uniform.
//!
//! [`Snapshot`]: super::Snapshot

use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use hashbrown::HashTable;

/// Shard count: a one-item update copies the shard array (`SHARDS` pointers)
/// plus one shard (`len / SHARDS` entries); 256 balances the two around 100k
/// entries.
pub(super) const SHARDS: usize = 1 << SHARD_BITS;
const SHARD_BITS: u32 = 8;

type Shard<T> = Option<Arc<HashTable<T>>>;

/// The tables' hash function: foldhash, randomly seeded per table lineage.
pub(super) type Hasher = foldhash::fast::RandomState;

/// What a [`Table`] stores: a value that carries its own key.
pub(super) trait Keyed {
    /// The hash of the key, consistent with what lookups pass to
    /// [`Table::find`] (computed with [`Table::hash`]).
    fn hash_key(&self, hasher: &Hasher) -> u64;
    fn same_key(&self, other: &Self) -> bool;
}

/// A persistent hash table: cheap to clone, copy-on-write per shard. Hashing
/// and key equality are the caller's (`hash`, `eq` arguments), so keys can
/// be borrowed from the stored values or composite.
pub(super) struct Table<T> {
    hasher: Hasher,
    len: usize,
    /// None until the first insert: an empty snapshot allocates nothing.
    shards: Option<Arc<[Shard<T>; SHARDS]>>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table {
            hasher: Hasher::default(),
            len: 0,
            shards: None,
        }
    }
}

impl<T> Clone for Table<T> {
    /// One refcount increment; entries are shared until written.
    fn clone(&self) -> Self {
        Table {
            hasher: self.hasher.clone(),
            len: self.len,
            shards: self.shards.clone(),
        }
    }
}

#[inline]
fn shard_index(hash: u64) -> usize {
    (hash.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SHARD_BITS)) as usize
}

impl<T> Table<T> {
    #[inline]
    pub fn hash<K: Hash + ?Sized>(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The entry with this hash for which `eq` holds. No allocation.
    #[inline]
    pub fn find(&self, hash: u64, eq: impl FnMut(&T) -> bool) -> Option<&T> {
        self.shards.as_ref()?[shard_index(hash)]
            .as_ref()?
            .find(hash, eq)
    }

    pub fn iter(&self) -> Iter<'_, T> {
        Iter {
            shards: self.shards.as_deref().map_or(&[][..], |s| &s[..]).iter(),
            current: hashbrown::hash_table::Iter::default(),
            remaining: self.len,
        }
    }

    /// Whether both tables hold equal entries. Shards shared by the two
    /// (one derived from the other) are skipped without looking inside.
    pub fn same_entries(&self, other: &Table<T>) -> bool
    where
        T: Keyed + PartialEq,
    {
        if self.len != other.len {
            return false;
        }
        let (Some(mine), Some(theirs)) = (&self.shards, &other.shards) else {
            return true; // both empty (lengths are equal)
        };
        if Arc::ptr_eq(mine, theirs) {
            return true;
        }
        mine.iter().zip(theirs.iter()).all(|(a, b)| match (a, b) {
            // The same shard object can only be shared within one lineage,
            // hence under one hasher: identical contents.
            (Some(a), Some(b)) if Arc::ptr_eq(a, b) => true,
            (None, _) => true,
            (Some(a), _) => a.iter().all(|entry| {
                other
                    .find(entry.hash_key(&other.hasher), |o| o.same_key(entry))
                    .is_some_and(|o| o == entry)
            }),
        })
    }
    /// How many shards differ between the two tables (not the same
    /// allocation, or present in one only).
    #[cfg(test)]
    pub fn copied_shards(&self, other: &Table<T>) -> usize {
        let none = [const { None }; SHARDS];
        let a = self.shards.as_deref().unwrap_or(&none);
        let b = other.shards.as_deref().unwrap_or(&none);
        a.iter()
            .zip(b.iter())
            .filter(|(x, y)| match (x, y) {
                (None, None) => false,
                (Some(x), Some(y)) => !Arc::ptr_eq(x, y),
                _ => true,
            })
            .count()
    }
}

impl<T: Keyed + Clone> Table<T> {
    /// The shard for `hash`, unshared first (copy-on-write).
    fn shard_mut(&mut self, hash: u64) -> &mut HashTable<T> {
        let shards = Arc::make_mut(
            self.shards
                .get_or_insert_with(|| Arc::new([const { None }; SHARDS])),
        );
        Arc::make_mut(shards[shard_index(hash)].get_or_insert_with(Default::default))
    }

    /// Inserts `value`, or replaces the entry with the same key; returns
    /// the replaced entry.
    pub fn insert(&mut self, value: T) -> Option<T> {
        let hasher = self.hasher.clone();
        let hash = value.hash_key(&hasher);
        let shard = self.shard_mut(hash);
        match shard.find_entry(hash, |e| e.same_key(&value)) {
            Ok(mut entry) => Some(std::mem::replace(entry.get_mut(), value)),
            Err(_) => {
                shard.insert_unique(hash, value, |e| e.hash_key(&hasher));
                self.len += 1;
                None
            }
        }
    }

    /// The entry for which `eq` holds, for changing in place (its key must
    /// stay the same). Copies the shard first if it is shared.
    pub fn find_mut(&mut self, hash: u64, mut eq: impl FnMut(&T) -> bool) -> Option<&mut T> {
        self.find(hash, &mut eq)?;
        self.shard_mut(hash).find_mut(hash, eq)
    }

    /// Removes the entry for which `eq` holds. A missing entry costs a
    /// lookup, not a copy.
    pub fn remove(&mut self, hash: u64, eq: impl FnMut(&T) -> bool) -> Option<T> {
        let mut eq = eq;
        self.find(hash, &mut eq)?;
        let removed = match self.shard_mut(hash).find_entry(hash, eq) {
            Ok(entry) => entry.remove().0,
            Err(_) => unreachable!("found above"),
        };
        self.len -= 1;
        Some(removed)
    }
}

/// Every entry, shard by shard (no particular order).
pub(super) struct Iter<'a, T> {
    shards: std::slice::Iter<'a, Shard<T>>,
    current: hashbrown::hash_table::Iter<'a, T>,
    remaining: usize,
}

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = &'a T;

    fn next(&mut self) -> Option<&'a T> {
        loop {
            if let Some(item) = self.current.next() {
                self.remaining -= 1;
                return Some(item);
            }
            self.current = self
                .shards
                .next()?
                .as_ref()
                .map(|s| s.iter())
                .unwrap_or_default();
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl<T> ExactSizeIterator for Iter<'_, T> {}

#[cfg(test)]
mod tests {
    use super::*;

    type E = (u32, &'static str);

    impl Keyed for E {
        fn hash_key(&self, hasher: &Hasher) -> u64 {
            hasher.hash_one(self.0)
        }
        fn same_key(&self, other: &Self) -> bool {
            self.0 == other.0
        }
    }

    fn get(t: &Table<E>, k: u32) -> Option<&E> {
        t.find(t.hash(&k), |e| e.0 == k)
    }

    #[test]
    fn insert_replace_remove_and_share() {
        let mut a: Table<E> = Table::default();
        assert!(a.is_empty());
        assert_eq!(a.iter().len(), 0);
        assert!(get(&a, 1).is_none());
        for k in 0..2000u32 {
            assert!(a.insert((k, "a")).is_none());
        }
        assert_eq!(a.len(), 2000);
        let b = a.clone();
        let mut c = a.clone();
        assert_eq!(c.insert((7, "c")), Some((7, "a")));
        assert_eq!(c.remove(c.hash(&8u32), |e| e.0 == 8), Some((8, "a")));
        assert_eq!(c.remove(c.hash(&99_999u32), |e| e.0 == 99_999), None);
        assert_eq!(c.len(), 1999);
        // The originals are untouched.
        assert_eq!(get(&a, 7), Some(&(7, "a")));
        assert_eq!(get(&b, 8), Some(&(8, "a")));
        assert_eq!(get(&c, 7), Some(&(7, "c")));
        assert!(get(&c, 8).is_none());
        // Only the touched shards were copied.
        assert!(c.copied_shards(&a) <= 2);
        assert_eq!(b.copied_shards(&a), 0);
        // 2000 entries over 256 shards: hardly any left empty.
        assert!(a.copied_shards(&Table::default()) > SHARDS - 8);
        assert_eq!(c.iter().count(), 1999);
        assert_eq!(c.iter().len(), 1999);

        assert!(a.same_entries(&b));
        assert!(!a.same_entries(&c) && !c.same_entries(&a));
        // Built independently (another hasher), equal entries.
        let mut d: Table<E> = Table::default();
        for e in c.iter() {
            d.insert(*e);
        }
        assert!(c.same_entries(&d) && d.same_entries(&c));
        // Same keys, one value differs.
        d.insert((9, "d"));
        assert!(!c.same_entries(&d));
        assert!(Table::<E>::default().same_entries(&Table::default()));
    }
}
