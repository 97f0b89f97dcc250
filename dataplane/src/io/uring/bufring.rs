//! The core's provided-buffer ring: receive buffers the kernel picks from
//! as bytes arrive on any of the core's sockets, so an idle connection
//! holds no buffer and a receive needs no system call.
//!
//! One ring per core, never per connection. The kernel takes buffers in
//! ring order, so a ring holding every buffer would cycle through all of
//! them and make the whole pool resident even when a few at a time are in
//! use. So the ring holds only a working set ([`BufRing::target`]) and the
//! rest wait on a stack: a buffer coming back goes on the stack, and the
//! ring is topped up from the top of it, the buffers used last (already
//! resident). The working set doubles whenever the ring runs dry (a
//! receive ends with ENOBUFS), so resident memory follows the core's peak
//! need, not the pool's size. A [`RecvBuf`] handed out by a completion
//! gives its buffer back when dropped.

use std::cell::Cell;
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::{types::BufRingEntry, IoUring};

/// The ring and the memory of its buffers.
pub struct BufRing {
    /// The buffer group id receives name.
    group: u16,
    /// Ring entries (a power of two) = number of buffers.
    count: u16,
    size: u32,
    /// The ring of `count` entries, page-aligned (mmap).
    entries: *mut BufRingEntry,
    entries_len: usize,
    /// `count × size` bytes of buffers (mmap).
    memory: *mut u8,
    memory_len: usize,
    /// Our copy of the tail: the next entry we fill.
    tail: Cell<u16>,
    /// Buffers in the kernel's hands.
    available: Cell<usize>,
    /// How many buffers the ring is kept topped up to.
    target: Cell<usize>,
    /// Buffers nobody uses that are not in the ring, the last returned on
    /// top.
    spare: std::cell::RefCell<Vec<u16>>,
}

/// The working set a ring starts with.
const FIRST_TARGET: usize = 16;

impl BufRing {
    /// Maps `count` buffers of `size` bytes and registers them with `ring`
    /// as group `group`.
    pub(super) fn new(ring: &IoUring, group: u16, count: u16, size: u32) -> io::Result<Self> {
        if !count.is_power_of_two() || count > 32768 || size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "receive buffers: {count} is not a power of two up to 32768, or size {size} is 0"
                ),
            ));
        }
        let entries_len = (count as usize * std::mem::size_of::<BufRingEntry>()).max(4096);
        let memory_len = count as usize * size as usize;
        let entries = map(entries_len)?.cast::<BufRingEntry>();
        let memory = match map(memory_len) {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: unmaps the mapping made just above, unused since.
                unsafe { libc::munmap(entries.cast(), entries_len) };
                return Err(e);
            }
        };
        let this = Self {
            group,
            count,
            size,
            entries,
            entries_len,
            memory,
            memory_len,
            tail: Cell::new(0),
            available: Cell::new(0),
            target: Cell::new(FIRST_TARGET.min(count as usize)),
            spare: std::cell::RefCell::new((0..count).rev().collect()),
        };
        this.top_up();
        // SAFETY: `entries` is a page-aligned mapping of `count` entries
        // that lives as long as `self`; the Poller drops its ring (and with
        // it this registration) before its `Rc<BufRing>`, and buffers handed
        // out keep the memory alive past that.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(entries as u64, count, group, 0)?
        };
        Ok(this)
    }

    pub fn group(&self) -> u16 {
        self.group
    }

    pub fn count(&self) -> usize {
        self.count as usize
    }

    pub fn buffer_size(&self) -> usize {
        self.size as usize
    }

    /// Buffers the kernel can fill now.
    pub fn available(&self) -> usize {
        self.available.get()
    }

    /// Buffers nobody reads: in the ring or waiting to go back in.
    pub fn unused(&self) -> usize {
        self.available.get() + self.spare.borrow().len()
    }

    /// The working set the ring is kept topped up to.
    pub fn target(&self) -> usize {
        self.target.get()
    }

    /// The ring ran dry: double the working set (up to the pool) and top
    /// it up.
    pub(super) fn grow(&self) {
        let t = (self.target.get() * 2).min(self.count as usize);
        self.target.set(t);
        self.top_up();
    }

    /// Moves buffers from the spare stack (the last returned first) into
    /// the ring until it holds the target.
    fn top_up(&self) {
        let mut spare = self.spare.borrow_mut();
        while self.available.get() < self.target.get() {
            let Some(bid) = spare.pop() else { break };
            self.provide(bid);
        }
    }

    /// Puts buffer `bid` at the ring's tail, for the kernel to fill again.
    fn provide(&self, bid: u16) {
        let tail = self.tail.get();
        let mask = self.count - 1;
        // SAFETY: `tail & mask` < count, inside the entries mapping. The
        // kernel reads entries only between its head and the published
        // tail, and this one is past the published tail until the store
        // below.
        let entry = unsafe { &mut *self.entries.add((tail & mask) as usize) };
        // SAFETY: bid < count: the buffer lies inside `memory`.
        entry.set_addr(unsafe { self.memory.add(bid as usize * self.size as usize) } as u64);
        entry.set_len(self.size);
        entry.set_bid(bid);
        let tail = tail.wrapping_add(1);
        self.tail.set(tail);
        // SAFETY: the tail field overlays the first entry's reserved
        // bytes, inside the mapping; the kernel reads it with acquire
        // ordering, so the entry written above is visible first.
        let shared = unsafe { &*(BufRingEntry::tail(self.entries).cast::<AtomicU16>()) };
        shared.store(tail, Ordering::Release);
        self.available.set(self.available.get() + 1);
    }

    /// A completion handed buffer `bid` to us.
    pub(super) fn taken(&self) {
        self.available.set(self.available.get().saturating_sub(1));
    }

    /// Returns a buffer whose bytes nobody reads any more.
    pub(super) fn give_back(&self, bid: u16) {
        if bid < self.count {
            self.spare.borrow_mut().push(bid);
            self.top_up();
        }
    }

    /// The first `len` bytes of buffer `bid`.
    ///
    /// # Safety
    /// `bid` must be a buffer a completion handed out and that has not been
    /// given back: the kernel does not write it meanwhile.
    unsafe fn bytes(&self, bid: u16, len: usize) -> &[u8] {
        debug_assert!(bid < self.count && len <= self.size as usize);
        // SAFETY: inside the mapping (bid < count, len <= size), and not
        // written by the kernel while handed out (the caller's promise).
        unsafe {
            std::slice::from_raw_parts(self.memory.add(bid as usize * self.size as usize), len)
        }
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: both mappings were made in `new` with these lengths. By
        // the time the last `Rc<BufRing>` goes, the ring that used them is
        // gone (the Poller drops its ring first) and no RecvBuf is left.
        unsafe {
            libc::munmap(self.entries.cast(), self.entries_len);
            libc::munmap(self.memory.cast(), self.memory_len);
        }
    }
}

fn map(len: usize) -> io::Result<*mut u8> {
    // SAFETY: a fresh private anonymous mapping; no existing memory is
    // touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// Bytes a receive completion delivered, in a buffer of the core's ring;
/// the buffer goes back to the ring when this is dropped. Core-local.
pub struct RecvBuf {
    ring: Rc<BufRing>,
    bid: u16,
    start: u32,
    end: u32,
}

impl RecvBuf {
    /// Takes buffer `bid` holding `len` bytes (a receive completion's).
    pub(super) fn new(ring: &Rc<BufRing>, bid: u16, len: u32) -> Self {
        ring.taken();
        Self {
            ring: ring.clone(),
            bid,
            start: 0,
            end: len.min(ring.size),
        }
    }

    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Drops the first `n` bytes (they were consumed).
    pub fn advance(&mut self, n: usize) {
        self.start = (self.start + n as u32).min(self.end);
    }

    /// The buffer's full size: what it holds of the ring, whatever its
    /// length.
    pub fn footprint(&self) -> usize {
        self.ring.size as usize
    }
}

impl std::ops::Deref for RecvBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: this RecvBuf owns buffer `bid` until it is dropped, so
        // the kernel does not write it; `end` <= size.
        let all = unsafe { self.ring.bytes(self.bid, self.end as usize) };
        &all[self.start as usize..]
    }
}

impl Drop for RecvBuf {
    fn drop(&mut self) {
        self.ring.give_back(self.bid);
    }
}
