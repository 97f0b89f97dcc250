//! In-kernel redirect of passthrough connections (BPF sockmap, `sk_skb`).
//!
//! Once a passthrough connection is set up, both of its sockets can be
//! handed to the kernel: a stream-verdict program sends every segment that
//! arrives on one socket straight out of the other, so the proxy is not
//! woken per message and makes no system call per message. The proxy keeps
//! the sockets open and sleeps until a hang-up, an error or the core's
//! bell (see [`Redirected`] for the protocol); byte counts come from the
//! kernel.
//!
//! No BPF toolchain is needed: the program is about fifty instructions,
//! written here with a small typed assembler ([`Insn`], [`Asm`]) and loaded
//! with the raw `bpf(2)` system call. [`Sockmap::new`] makes every kernel
//! object the redirect needs and says why in [`Unsupported`] when the
//! kernel refuses one, so the caller keeps the normal copy path.
//!
//! # Kernel objects (one set per core)
//! - `targets`: a `SOCKHASH` without programs: `cookie(a) → b`,
//!   `cookie(b) → a` (keyed by the *source* socket's cookie).
//! - `verdict`: a `SOCKHASH` keyed by a socket's own cookie, with the
//!   program attached (`BPF_SK_SKB_STREAM_VERDICT`): only sockets in it
//!   have their arriving data handed to the program.
//! - `counts`: a `HASH`, `cookie(source) → [redirected, kept]`, bit 63 of
//!   `redirected` set once the direction has stalled.
//! - `bell`: a ring buffer where the program writes a source's cookie when
//!   its direction passes its bell mark and when it stalls.
//! - the program ([`verdict_program`]), per arriving segment: an empty one
//!   (a bare FIN) is dropped; one that fits the budget goes out of the
//!   target's egress and is counted; otherwise the direction stalls and
//!   the segment stays on the source, as does everything after it.
//!   Nothing with payload is ever dropped.
//!
//! A pair is never half in: both sockets are counted and are targets
//! before either is handed to the program, and a socket stops being handed
//! to the program before it stops being a target.
//!
//! # What the kernel does (verified on 6.18: by a test in
//! `tests/sockmap.rs`, or where marked, by an experiment recorded here)
//! - **No backpressure.** A redirected segment leaves the source's receive
//!   queue at once (its window reopens) and waits on the target's psock
//!   for a kernel worker to write it. Behind a destination that does not
//!   read, a sender put 512 MiB into that queue in under half a second.
//!   Hence the budget ([`Limits::budget`]): it bounds what one direction
//!   can make the kernel hold, and the bell at half of it tells the proxy
//!   to take the pair back while that is lossless.
//! - **Kept data cannot be handed back.** What a stalled direction keeps
//!   sits on the source's psock, part of it in a backlog that a worker
//!   moves on later; it leaves with the psock when the socket leaves the
//!   maps, and while it is there a read can return newer bytes from TCP's
//!   queue first. (Experiment: reading it out at a handback, then leaving
//!   the maps, lost 560 940 of 1 118 808 kept bytes.) So a stall means a
//!   reset ([`Redirected::finish`] refuses), and the proxy answers the
//!   bell before it.
//! - **The proxy must not poll for `POLLIN`.** The verdict path wakes
//!   `POLLIN` waiters after every segment (measured: two wake-ups per
//!   round trip); `POLLRDHUP` and `POLLERR` waiters are not woken. Stalls
//!   therefore ring a bell rather than making a socket readable.
//! - **An empty segment breaks the target.** Redirecting a bare FIN makes
//!   the worker's send return 0, which it takes for a hard error: the
//!   target gets `EPIPE` (`POLLERR`) and stops sending. (Experiment, with
//!   a program that redirected every segment; the half-close tests check
//!   that no `EPIPE` shows with this one.) The program drops
//!   empty segments; TCP has already recorded the FIN, and the source
//!   still shows EOF (`POLLRDHUP`), so the proxy passes the FIN on once
//!   that direction has delivered everything ([`Flow::done`]).
//! - Data already queued on a socket when it enters `verdict` waits until
//!   something calls its `sk_data_ready`; a new segment does, and so does
//!   setting `SO_RCVLOWAT` (TCP re-checks readiness), which
//!   [`Sockmap::splice_pair`] does, so those bytes go out first, in order.
//! - Only established sockets enter a socket map: one that has received
//!   its FIN is refused (`EOPNOTSUPP`), and the caller keeps copying.
//! - `FIONREAD` on a socket in a map counts only its psock's queue, not
//!   TCP's receive queue: it is read only before the handoff.
//! - Taking a target out of every map discards what is queued on its
//!   psock, so removal is two steps: [`Redirected::stop`] (no new data is
//!   redirected; it waits in TCP's queue, with TCP's flow control), then
//!   [`Redirected::finish`] once nothing is in flight.
//! - A reset reaches the proxy as `POLLERR` on the reset socket; bytes
//!   redirected toward it are lost, as they would be anyway.
//!
//! # Byte counts
//! Bytes one direction moved are counted where they are written, as the
//! copy path counts them: payload the kernel put into the destination's
//! send queue since the handoff, from one `TCP_INFO` snapshot (taken under
//! the socket lock): `bytes_sent - bytes_retrans + notsent_bytes`, less a
//! FIN still queued ([`written`]). `bytes_acked` would lag by what is in
//! flight on the wire, and `bytes_received` of the source counts the FIN
//! and data that has gone nowhere yet. The program's own count of what it
//! redirected gives what is still in flight inside the kernel.
//!
//! # Sharing
//! One [`Sockmap`] per core: its bell then names only that core's pairs.
//! The maps and the program are kernel objects, locked per bucket by the
//! kernel off our data path; nothing in userspace is shared.

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// One eBPF instruction, as the kernel reads it (`struct bpf_insn`):
/// opcode, destination register (low nibble) and source register (high
/// nibble), a signed 16-bit offset, a signed 32-bit immediate.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

/// The eBPF registers: r0 return value, r1-r5 arguments (r1 holds the
/// context on entry), r6-r9 callee-saved, r10 the read-only frame pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Reg {
    R0 = 0,
    R1,
    R2,
    R3,
    R4,
    R5,
    R6,
    R7,
    R8,
    R9,
    R10,
}

// Opcode parts (linux/bpf_common.h, linux/bpf.h): class | size/op | mode/source.
const BPF_LD: u8 = 0x00;
const BPF_LDX: u8 = 0x01;
const BPF_STX: u8 = 0x03;
const BPF_JMP: u8 = 0x05;
const BPF_ALU64: u8 = 0x07;
const BPF_W: u8 = 0x00;
const BPF_DW: u8 = 0x18;
const BPF_IMM: u8 = 0x00;
const BPF_MEM: u8 = 0x60;
const BPF_ADD: u8 = 0x00;
const BPF_OR: u8 = 0x40;
const BPF_LSH: u8 = 0x60;
const BPF_MOV: u8 = 0xb0;
const BPF_JA: u8 = 0x00;
const BPF_JEQ: u8 = 0x10;
const BPF_JGT: u8 = 0x20;
const BPF_JNE: u8 = 0x50;
const BPF_JSLT: u8 = 0xc0;
const BPF_CALL: u8 = 0x80;
const BPF_EXIT: u8 = 0x90;
const BPF_K: u8 = 0x00;
const BPF_X: u8 = 0x08;
/// `src_reg` of a 64-bit immediate load that names a map by descriptor.
const BPF_PSEUDO_MAP_FD: u8 = 1;

impl Insn {
    const fn new(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs: ((src as u8) << 4) | dst as u8,
            off,
            imm,
        }
    }

    /// `dst = src` (64-bit register copy).
    pub const fn mov64_reg(dst: Reg, src: Reg) -> Insn {
        Insn::new(BPF_ALU64 | BPF_MOV | BPF_X, dst, src, 0, 0)
    }

    /// `dst = imm` (sign-extended to 64 bits).
    pub const fn mov64_imm(dst: Reg, imm: i32) -> Insn {
        Insn::new(BPF_ALU64 | BPF_MOV | BPF_K, dst, Reg::R0, 0, imm)
    }

    /// `dst += imm` (64-bit).
    pub const fn add64_imm(dst: Reg, imm: i32) -> Insn {
        Insn::new(BPF_ALU64 | BPF_ADD | BPF_K, dst, Reg::R0, 0, imm)
    }

    /// `dst += src` (64-bit).
    pub const fn add64_reg(dst: Reg, src: Reg) -> Insn {
        Insn::new(BPF_ALU64 | BPF_ADD | BPF_X, dst, src, 0, 0)
    }

    /// `dst |= src` (64-bit).
    pub const fn or64_reg(dst: Reg, src: Reg) -> Insn {
        Insn::new(BPF_ALU64 | BPF_OR | BPF_X, dst, src, 0, 0)
    }

    /// `dst <<= imm` (64-bit).
    pub const fn lsh64_imm(dst: Reg, imm: i32) -> Insn {
        Insn::new(BPF_ALU64 | BPF_LSH | BPF_K, dst, Reg::R0, 0, imm)
    }

    /// `*(u64 *)(dst + off) = src`: a store to the stack or a map value.
    pub const fn stx_dw(dst: Reg, off: i16, src: Reg) -> Insn {
        Insn::new(BPF_STX | BPF_MEM | BPF_DW, dst, src, off, 0)
    }

    /// `dst = *(u32 *)(src + off)`: for a context, a field of `__sk_buff`.
    pub const fn ldx_w(dst: Reg, src: Reg, off: i16) -> Insn {
        Insn::new(BPF_LDX | BPF_MEM | BPF_W, dst, src, off, 0)
    }

    /// `dst = *(u64 *)(src + off)`.
    pub const fn ldx_dw(dst: Reg, src: Reg, off: i16) -> Insn {
        Insn::new(BPF_LDX | BPF_MEM | BPF_DW, dst, src, off, 0)
    }

    /// Calls kernel helper number `helper` with r1-r5; the result lands
    /// in r0 and r1-r5 are clobbered.
    pub const fn call(helper: i32) -> Insn {
        Insn::new(BPF_JMP | BPF_CALL, Reg::R0, Reg::R0, 0, helper)
    }

    /// Returns r0 to the kernel.
    pub const fn exit() -> Insn {
        Insn::new(BPF_JMP | BPF_EXIT, Reg::R0, Reg::R0, 0, 0)
    }

    /// `dst = imm` for a full 64-bit immediate: two slots, the second
    /// holding the upper half.
    pub const fn ld_imm64(dst: Reg, imm: u64) -> [Insn; 2] {
        [
            Insn::new(
                BPF_LD | BPF_DW | BPF_IMM,
                dst,
                Reg::R0,
                0,
                imm as u32 as i32,
            ),
            Insn::new(0, Reg::R0, Reg::R0, 0, (imm >> 32) as u32 as i32),
        ]
    }

    /// `dst = map`: a two-slot 64-bit immediate load whose immediate is a
    /// map descriptor; the verifier replaces it with the map's address.
    pub const fn ld_map_fd(dst: Reg, map_fd: RawFd) -> [Insn; 2] {
        [
            Insn {
                code: BPF_LD | BPF_DW | BPF_IMM,
                regs: (BPF_PSEUDO_MAP_FD << 4) | dst as u8,
                off: 0,
                imm: map_fd,
            },
            Insn::new(0, Reg::R0, Reg::R0, 0, 0),
        ]
    }
}

/// A conditional jump's test (64-bit compares).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    /// `dst == imm`
    EqImm(Reg, i32),
    /// `dst != imm`
    NeImm(Reg, i32),
    /// `dst < imm`, signed: with 0, "bit 63 is set".
    SltImm(Reg, i32),
    /// `dst > src`, unsigned.
    GtReg(Reg, Reg),
}

/// A forward jump target in an [`Asm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label(usize);

/// A tiny assembler: instructions plus forward jumps to labels, so the
/// program is written as the listing reads and no offset is counted by
/// hand (an off-by-one there is a verifier rejection at best).
#[derive(Default)]
pub struct Asm {
    insns: Vec<Insn>,
    /// (index of the jump instruction, its label)
    fixups: Vec<(usize, Label)>,
    /// Where each label points, once placed.
    labels: Vec<Option<usize>>,
}

impl Asm {
    pub fn push(&mut self, insns: impl IntoIterator<Item = Insn>) {
        self.insns.extend(insns);
    }

    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    /// Places `label` at the next instruction.
    pub fn place(&mut self, label: Label) {
        self.labels[label.0] = Some(self.insns.len());
    }

    /// `if cond goto label` (or always, with `None`).
    pub fn jump(&mut self, cond: Option<Cond>, to: Label) {
        let insn = match cond {
            None => Insn::new(BPF_JMP | BPF_JA, Reg::R0, Reg::R0, 0, 0),
            Some(Cond::EqImm(r, k)) => Insn::new(BPF_JMP | BPF_JEQ | BPF_K, r, Reg::R0, 0, k),
            Some(Cond::NeImm(r, k)) => Insn::new(BPF_JMP | BPF_JNE | BPF_K, r, Reg::R0, 0, k),
            Some(Cond::SltImm(r, k)) => Insn::new(BPF_JMP | BPF_JSLT | BPF_K, r, Reg::R0, 0, k),
            Some(Cond::GtReg(d, s)) => Insn::new(BPF_JMP | BPF_JGT | BPF_X, d, s, 0, 0),
        };
        self.fixups.push((self.insns.len(), to));
        self.insns.push(insn);
    }

    /// The instructions with every jump offset filled in (counted in
    /// instructions after the jump). Panics on a label never placed or
    /// placed behind its jump: a bug in the program text, caught by the
    /// unit tests.
    pub fn finish(mut self) -> Vec<Insn> {
        for &(at, Label(l)) in &self.fixups {
            let to = self.labels[l].expect("label placed");
            assert!(to > at, "forward jumps only");
            self.insns[at].off = i16::try_from(to - at - 1).expect("jump in range");
        }
        self.insns
    }
}

// Kernel helper numbers (`enum bpf_func_id`), program and map types,
// commands, flags: stable ABI (linux/bpf.h).
const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
const HELPER_GET_SOCKET_COOKIE: i32 = 46;
const HELPER_SK_REDIRECT_HASH: i32 = 72;
const HELPER_RINGBUF_OUTPUT: i32 = 130;
const BPF_MAP_CREATE: u32 = 0;
const BPF_MAP_LOOKUP_ELEM: u32 = 1;
const BPF_MAP_UPDATE_ELEM: u32 = 2;
const BPF_MAP_DELETE_ELEM: u32 = 3;
const BPF_PROG_LOAD: u32 = 5;
const BPF_PROG_ATTACH: u32 = 8;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_TYPE_SOCKHASH: u32 = 18;
const BPF_MAP_TYPE_RINGBUF: u32 = 27;
const BPF_PROG_TYPE_SK_SKB: u32 = 14;
const BPF_SK_SKB_STREAM_VERDICT: u32 = 5;
/// Map update flag: fail if the key exists, so a socket already handed
/// over (by another pair, another core) is refused, not overwritten.
const BPF_NOEXIST: u64 = 1;
/// Map creation flag: allocate elements on insert, so an idle map costs
/// memory for what it holds, not for its capacity.
const BPF_F_NO_PREALLOC: u32 = 1;
/// The verdict that lets a segment go on: to the redirect target if one
/// was set, else to the socket it arrived on.
const SK_PASS: i32 = 1;
/// The verdict that frees a segment (used for empty ones only).
const SK_DROP: i32 = 0;
/// `offsetof(struct __sk_buff, len)`.
const SKB_LEN: i16 = 0;
/// Bit 63 of a count: the direction has stalled.
const STALLED: u64 = 1 << 63;

/// The verdict program, for the `counts`, `targets` and `bell` maps: it
/// redirects at most `budget` bytes per direction per handoff, and rings
/// the bell when a direction passes `bell_at` (the proxy's cue to take
/// the pair back) and when it stalls at the budget.
///
/// ```text
///     r6 = r1                          ; the skb (r1-r5 die in calls)
///     r7 = skb->len
///     if r7 == 0 goto drop             ; a bare FIN: never redirect it
///     r0 = bpf_get_socket_cookie(r1)
///     *(u64 *)(r10 - 8) = r0           ; the key, on the stack
///     r0 = bpf_map_lookup_elem(counts, r10 - 8)
///     if r0 == 0 goto pass             ; not ours: leave it here
///     r8 = r0                          ; &{count, kept}
///     r9 = count
///     if r9 s< 0 goto keep             ; stalled: keep order, stay here
///     if r9 + r7 > budget goto stall
///     r0 = bpf_sk_redirect_hash(r6, targets, r10 - 8, 0)  ; 0: egress
///     if r0 != SK_PASS goto stall      ; target gone
///     count = r9 + r7
///     if r9 <= bell_at < count: bpf_ringbuf_output(bell, cookie)
///     r0 = SK_PASS; exit
/// stall:
///     count = r9 | 1 << 63
///     bpf_ringbuf_output(bell, r10 - 8, 8, 0)
/// keep:
///     kept += r7
/// pass:
///     r0 = SK_PASS; exit
/// drop:
///     r0 = SK_DROP; exit
/// ```
///
/// The count and `kept` are written only here, under the source socket's
/// lock (the verdict runs from its `sk_data_ready` or from `SO_RCVLOWAT`,
/// both with the socket locked), so they need no atomics; userspace only
/// creates, reads and deletes them.
pub fn verdict_program(
    counts_fd: RawFd,
    targets_fd: RawFd,
    bell_fd: RawFd,
    budget: u64,
    bell_at: u64,
) -> Vec<Insn> {
    use Reg::*;
    let mut a = Asm::default();
    let [drop, pass, keep, stall, done, ring] = [(); 6].map(|_| a.label());
    let ring_bell = |a: &mut Asm| {
        a.push(Insn::ld_map_fd(R1, bell_fd));
        a.push([
            Insn::mov64_reg(R2, R10),
            Insn::add64_imm(R2, -8),
            Insn::mov64_imm(R3, 8),
            Insn::mov64_imm(R4, 0),
            Insn::call(HELPER_RINGBUF_OUTPUT),
        ]);
    };
    a.push([Insn::mov64_reg(R6, R1), Insn::ldx_w(R7, R6, SKB_LEN)]);
    a.jump(Some(Cond::EqImm(R7, 0)), drop);
    a.push([
        Insn::call(HELPER_GET_SOCKET_COOKIE),
        Insn::stx_dw(R10, -8, R0),
    ]);
    a.push(Insn::ld_map_fd(R1, counts_fd));
    a.push([
        Insn::mov64_reg(R2, R10),
        Insn::add64_imm(R2, -8),
        Insn::call(HELPER_MAP_LOOKUP_ELEM),
    ]);
    a.jump(Some(Cond::EqImm(R0, 0)), pass);
    a.push([Insn::mov64_reg(R8, R0), Insn::ldx_dw(R9, R8, 0)]);
    a.jump(Some(Cond::SltImm(R9, 0)), keep);
    a.push([Insn::mov64_reg(R1, R9), Insn::add64_reg(R1, R7)]);
    a.push(Insn::ld_imm64(R2, budget));
    a.jump(Some(Cond::GtReg(R1, R2)), stall);
    a.push([Insn::mov64_reg(R1, R6)]);
    a.push(Insn::ld_map_fd(R2, targets_fd));
    a.push([
        Insn::mov64_reg(R3, R10),
        Insn::add64_imm(R3, -8),
        Insn::mov64_imm(R4, 0),
        Insn::call(HELPER_SK_REDIRECT_HASH),
    ]);
    a.jump(Some(Cond::NeImm(R0, SK_PASS)), stall);
    a.push([
        Insn::mov64_reg(R1, R9),
        Insn::add64_reg(R1, R7),
        Insn::stx_dw(R8, 0, R1),
    ]);
    a.push(Insn::ld_imm64(R2, bell_at));
    a.jump(Some(Cond::GtReg(R9, R2)), done);
    a.jump(Some(Cond::GtReg(R1, R2)), ring);
    a.jump(None, done);
    a.place(ring);
    ring_bell(&mut a);
    a.place(done);
    a.push([Insn::mov64_imm(R0, SK_PASS), Insn::exit()]);
    a.place(stall);
    a.push([
        Insn::mov64_imm(R1, 1),
        Insn::lsh64_imm(R1, 63),
        Insn::or64_reg(R9, R1),
        Insn::stx_dw(R8, 0, R9),
    ]);
    ring_bell(&mut a);
    a.place(keep);
    a.push([
        Insn::ldx_dw(R1, R8, 8),
        Insn::add64_reg(R1, R7),
        Insn::stx_dw(R8, 8, R1),
    ]);
    a.place(pass);
    a.push([Insn::mov64_imm(R0, SK_PASS), Insn::exit()]);
    a.place(drop);
    a.push([Insn::mov64_imm(R0, SK_DROP), Insn::exit()]);
    a.finish()
}

/// `union bpf_attr` for `BPF_MAP_CREATE` (the leading fields; the kernel
/// takes a shorter attribute and zero-fills the rest).
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

/// `union bpf_attr` for the element commands.
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `union bpf_attr` for `BPF_PROG_LOAD`.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `union bpf_attr` for `BPF_PROG_ATTACH`.
#[repr(C)]
#[derive(Default)]
struct AttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
}

/// `bpf(cmd, attr, sizeof attr)`.
fn sys_bpf<T>(cmd: u32, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is one of the repr(C) prefixes of `union bpf_attr`
    // above, valid for size_of::<T>() bytes; the kernel reads (and for some
    // commands writes) at most that many, and every pointer inside it
    // points at memory the caller keeps alive for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *mut T as *mut libc::c_void,
            size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A descriptor the kernel just returned from `bpf(2)`.
fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: bpf(2) returned a fresh descriptor (map or program, with
    // O_CLOEXEC) that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

fn name16(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    let n = name.len().min(15);
    out[..n].copy_from_slice(&name.as_bytes()[..n]);
    out
}

/// A map of `capacity` entries of the given key and value sizes (for a
/// ring buffer: no keys or values, `capacity` bytes).
fn create_map(
    map_type: u32,
    flags: u32,
    name: &str,
    capacity: u32,
    (key_size, value_size): (u32, u32),
) -> io::Result<OwnedFd> {
    let mut attr = MapCreateAttr {
        map_type,
        key_size,
        value_size,
        max_entries: capacity,
        map_flags: flags,
        map_name: name16(name),
        ..Default::default()
    };
    sys_bpf(BPF_MAP_CREATE, &mut attr).map(owned)
}

/// What kind of program [`load_program`] loads.
pub struct ProgramKind {
    pub prog_type: u32,
    /// 0 where the type has no attach type to declare at load.
    pub expected_attach_type: u32,
    /// Shown by `bpftool prog` (at most 15 bytes).
    pub name: &'static str,
}

const REDIRECT_PROGRAM: ProgramKind = ProgramKind {
    prog_type: BPF_PROG_TYPE_SK_SKB,
    expected_attach_type: 0,
    name: "ringway_redir",
};

/// Loads `insns` as a program of `kind`; on failure, the error and the
/// verifier's log (from a second attempt with logging on).
pub fn load_program(kind: &ProgramKind, insns: &[Insn]) -> Result<OwnedFd, (io::Error, String)> {
    const LICENSE: &CStr = c"GPL";
    let load = |log: &mut [u8]| {
        let mut attr = ProgLoadAttr {
            prog_type: kind.prog_type,
            expected_attach_type: kind.expected_attach_type,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: LICENSE.as_ptr() as u64,
            log_level: u32::from(!log.is_empty()),
            log_size: log.len() as u32,
            log_buf: log.as_mut_ptr() as u64,
            prog_name: name16(kind.name),
            ..Default::default()
        };
        sys_bpf(BPF_PROG_LOAD, &mut attr).map(owned)
    };
    load(&mut []).or_else(|e| {
        let mut log = vec![0u8; 64 << 10];
        match load(&mut log) {
            Ok(fd) => Ok(fd),
            Err(_) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                Err((e, String::from_utf8_lossy(&log[..end]).trim().to_owned()))
            }
        }
    })
}

fn attach_verdict(map: &OwnedFd, prog: &OwnedFd) -> io::Result<()> {
    let mut attr = AttachAttr {
        target_fd: map.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_SK_SKB_STREAM_VERDICT,
        attach_flags: 0,
    };
    sys_bpf(BPF_PROG_ATTACH, &mut attr).map(|_| ())
}

/// Inserts `key → value` (a socket descriptor for socket maps, a zeroed
/// `[count, kept]` for `counts`), failing if the key is there already.
fn map_insert<V>(map: &OwnedFd, key: u64, value: &V) -> io::Result<()> {
    let mut attr = ElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: &key as *const u64 as u64,
        value: value as *const V as u64,
        flags: BPF_NOEXIST,
        ..Default::default()
    };
    sys_bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(|_| ())
}

/// The `[count, kept]` of a source cookie in `counts`.
fn map_lookup(map: &OwnedFd, key: u64) -> io::Result<[u64; 2]> {
    let mut value = [0u64; 2];
    let mut attr = ElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: &key as *const u64 as u64,
        value: value.as_mut_ptr() as u64,
        ..Default::default()
    };
    sys_bpf(BPF_MAP_LOOKUP_ELEM, &mut attr)?;
    Ok(value)
}

/// Deletes `key`; a key already gone (the kernel takes a closed socket
/// out of its maps by itself) is not an error.
fn map_delete(map: &OwnedFd, key: u64) -> io::Result<()> {
    let mut attr = ElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: &key as *const u64 as u64,
        ..Default::default()
    };
    match sys_bpf(BPF_MAP_DELETE_ELEM, &mut attr) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r.map(|_| ()),
    }
}

/// Why the redirect cannot be used here: the step that failed, the error,
/// and what that usually means on this host.
#[derive(Debug, Clone)]
pub struct Unsupported {
    /// "create map", "load program", "attach program".
    pub step: &'static str,
    /// The errno, when a system call failed.
    pub errno: Option<i32>,
    /// A sentence for the operator (and the verifier's log, if any).
    pub reason: String,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sockmap redirect unavailable ({}): {}",
            self.step, self.reason
        )
    }
}

impl std::error::Error for Unsupported {}

/// A `/proc` file's text, trimmed.
fn proc_value(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// A `Name:` field of this thread's `/proc` status.
fn status_field(name: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

/// Whether this thread has capability `cap` in its effective set (the
/// set the kernel checks; capabilities are per thread).
fn has_cap(cap: u32) -> Option<bool> {
    let eff = u64::from_str_radix(&status_field("CapEff")?, 16).ok()?;
    Some(eff & (1 << cap) != 0)
}

/// Names the likely cause of `err` at `step` from what this host shows.
fn explain(step: &'static str, err: &io::Error, log: Option<String>) -> Unsupported {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_BPF: u32 = 39;
    let errno = err.raw_os_error();
    let mut reason = match errno {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            let mut why = Vec::new();
            // Unknown (no /proc) counts as present: only name what is seen.
            // CAP_SYS_ADMIN stands in for both in the kernel's bpf checks.
            let admin = has_cap(CAP_SYS_ADMIN).unwrap_or(true);
            let bpf = has_cap(CAP_BPF).unwrap_or(true) || admin;
            if !bpf {
                why.push("no CAP_BPF (or CAP_SYS_ADMIN)".to_owned());
                if let Some(v) = proc_value("/proc/sys/kernel/unprivileged_bpf_disabled") {
                    if v != "0" {
                        why.push(format!("kernel.unprivileged_bpf_disabled={v}"));
                    }
                }
            }
            if !(has_cap(CAP_NET_ADMIN).unwrap_or(true) || admin) {
                why.push(
                    "no CAP_NET_ADMIN (or CAP_SYS_ADMIN): socket maps and sk_skb \
                     programs need it"
                        .to_owned(),
                );
            }
            if status_field("Seccomp").is_some_and(|v| v != "0") {
                why.push(
                    "a seccomp filter is active (container runtimes often deny bpf(2))".to_owned(),
                );
            }
            if why.is_empty() {
                why.push(
                    "the capabilities are there, so an LSM (SELinux, AppArmor, lockdown) \
                     or a seccomp policy denied bpf(2)"
                        .to_owned(),
                );
            }
            format!("bpf(2) not permitted: {}", why.join("; "))
        }
        Some(libc::ENOSYS) => "bpf(2) does not exist here (a kernel without \
             CONFIG_BPF_SYSCALL, or a seccomp policy answering ENOSYS)"
            .to_owned(),
        Some(libc::EINVAL) if step == "create map" => "the kernel lacks a map type: \
             BPF_MAP_TYPE_SOCKHASH (CONFIG_BPF_SYSCALL, CONFIG_NET_SOCK_MSG, \
             Linux >= 4.18) or BPF_MAP_TYPE_RINGBUF (Linux >= 5.8)"
            .to_owned(),
        Some(libc::EINVAL) if step == "load program" => "the verifier refused the \
             program (it needs Linux >= 5.8 for ring buffers in sk_skb \
             programs; see the log)"
            .to_owned(),
        _ => format!("{step} failed"),
    };
    reason.push_str(&format!(" [{err}]"));
    if let Some(log) = log.filter(|l| !l.is_empty()) {
        reason.push_str("; verifier log:\n");
        reason.push_str(&log);
    }
    Unsupported {
        step,
        errno,
        reason,
    }
}

/// How much a [`Sockmap`] takes on.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Sockets each map holds (two per connection).
    pub sockets: u32,
    /// Bytes one direction may redirect per handoff: the bound on what a
    /// slow receiver can make the kernel hold for it if the proxy does not
    /// answer the bell. At the full budget the direction stalls (and the
    /// pair can only be reset).
    pub budget: u64,
    /// Bytes after which the bell rings for the proxy to take the pair back
    /// (at most half the budget: see [`Limits::bell_at`]).
    pub warn: u64,
}

impl Limits {
    /// Where the bell rings: `warn`, but never past half the budget, so
    /// the proxy always has at least as long to answer as the bell took.
    pub fn bell_at(&self) -> u64 {
        self.warn.min(self.budget / 2)
    }
}

impl Default for Limits {
    /// 32 768 connections. The bell at 2 MiB: small request/response
    /// traffic runs for a million exchanges per handoff; bulk, which the
    /// redirect moves slower than the copy path does (measured), goes back
    /// to the copy path. The stall at 32 MiB: the proxy has the 30 MiB in
    /// between to answer the bell, about 25 ms of a 10 Gbit/s sender. With
    /// the stall at 4 MiB (half of it after the bell, under 2 ms at that
    /// rate) a loaded 2-vCPU machine missed it and bulk uploads were reset
    /// (the perf suite's throughput warm-up). What the kernel holds for a
    /// slow receiver is normally what arrived before the take-back, so a
    /// few MiB; 32 MiB only if the proxy never answers.
    fn default() -> Limits {
        Limits {
            sockets: 65536,
            budget: 32 << 20,
            warn: 2 << 20,
        }
    }
}

/// The kernel objects of the redirect: four maps and the program.
pub struct Sockmap {
    /// `cookie(source) → destination socket`; no programs.
    targets: OwnedFd,
    /// `cookie → socket`, with the verdict program attached.
    verdict: OwnedFd,
    /// `cookie(source) → bytes redirected | STALLED`.
    counts: OwnedFd,
    /// Where the program announces stalls.
    bell: Bell,
    /// The attachment holds its own reference; kept so the program stays
    /// listed as this process's while it runs.
    _prog: OwnedFd,
    limits: Limits,
}

/// Bytes of the stall ring: 16 bytes a notice, so 4096 stalls between two
/// drains before a notice is lost (the stall bit is still set, and a
/// sweep of [`Redirected::flows`] still finds it).
const BELL_BYTES: u32 = 64 << 10;

impl Sockmap {
    /// [`Sockmap::with_limits`] with the default [`Limits`].
    pub fn new() -> Result<Sockmap, Unsupported> {
        Sockmap::with_limits(Limits::default())
    }

    /// Creates the maps, loads the program and attaches it: every step the
    /// redirect needs, so that a refusal shows here, with its reason, and
    /// not on a live connection.
    ///
    /// One per core: stalls are announced on this instance's
    /// [`bell`](Self::bell), so each core hears only of its own pairs.
    pub fn with_limits(limits: Limits) -> Result<Sockmap, Unsupported> {
        let create = |t, flags, name, capacity, sizes| {
            create_map(t, flags, name, capacity, sizes).map_err(|e| explain("create map", &e, None))
        };
        let n = limits.sockets;
        // A socket map's update value is a descriptor (u32 or u64; a
        // lookup from userspace, never done here, would need u64).
        let targets = create(BPF_MAP_TYPE_SOCKHASH, 0, "ringway_tgt", n, (8, 8))?;
        let verdict = create(BPF_MAP_TYPE_SOCKHASH, 0, "ringway_vrd", n, (8, 8))?;
        let counts = create(
            BPF_MAP_TYPE_HASH,
            BPF_F_NO_PREALLOC,
            "ringway_cnt",
            n,
            (8, 16),
        )?;
        let ring = create(BPF_MAP_TYPE_RINGBUF, 0, "ringway_bell", BELL_BYTES, (0, 0))?;
        let bell =
            Bell::map(ring, BELL_BYTES as usize).map_err(|e| explain("map ring", &e, None))?;
        let program = verdict_program(
            counts.as_raw_fd(),
            targets.as_raw_fd(),
            bell.fd.as_raw_fd(),
            limits.budget,
            limits.bell_at(),
        );
        let prog = load_program(&REDIRECT_PROGRAM, &program)
            .map_err(|(e, log)| explain("load program", &e, Some(log)))?;
        attach_verdict(&verdict, &prog).map_err(|e| explain("attach program", &e, None))?;
        Ok(Sockmap {
            targets,
            verdict,
            counts,
            bell,
            _prog: prog,
            limits,
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Readable (`POLLIN`) when a direction has passed its bell mark
    /// or stalled since the last [`rung`](Self::rung): the one descriptor
    /// a core polls for all its pairs.
    pub fn bell(&self) -> BorrowedFd<'_> {
        self.bell.fd.as_fd()
    }

    /// The source cookies ([`Redirected::cookies`]) of the directions that
    /// passed half their budget or stalled since the last call, oldest
    /// first (a direction that does both shows twice); clears the bell.
    pub fn rung(&self) -> Vec<u64> {
        self.bell.drain()
    }
}

/// The consumer side of a BPF ring buffer of 8-byte notices. The kernel
/// lays it out as a consumer page (ours to write: the consumer position),
/// then a producer page (the producer position) and the data, mapped
/// twice in a row so a record never wraps (read-only for us).
struct Bell {
    fd: OwnedFd,
    consumer: *mut u8,
    producer: *mut u8,
    page: usize,
    size: usize,
}

// SAFETY: the mappings belong to this value alone and go with it; the
// kernel side is synchronized through the positions' atomics.
unsafe impl Send for Bell {}

impl Bell {
    fn map(fd: OwnedFd, size: usize) -> io::Result<Bell> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let map = |len: usize, prot: i32, offset: usize| {
            // SAFETY: a fresh shared mapping of the ring's descriptor at
            // the offsets and with the protections the kernel allows.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    prot,
                    libc::MAP_SHARED,
                    fd.as_raw_fd(),
                    offset as libc::off_t,
                )
            };
            if p == libc::MAP_FAILED {
                Err(io::Error::last_os_error())
            } else {
                Ok(p.cast::<u8>())
            }
        };
        let consumer = map(page, libc::PROT_READ | libc::PROT_WRITE, 0)?;
        let producer = match map(page + 2 * size, libc::PROT_READ, page) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: `consumer` was mapped just above with this length.
                unsafe { libc::munmap(consumer.cast(), page) };
                return Err(e);
            }
        };
        Ok(Bell {
            fd,
            consumer,
            producer,
            page,
            size,
        })
    }

    /// The position at the start of the consumer or producer page.
    fn position(&self, page: *mut u8) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: `page` is one of this Bell's mappings, page-aligned and
        // alive as long as `self`; the kernel updates the position there
        // atomically.
        unsafe { &*(page as *const std::sync::atomic::AtomicU64) }
    }

    fn drain(&self) -> Vec<u64> {
        use std::sync::atomic::{AtomicU32, Ordering};
        const BUSY: u32 = 1 << 31;
        const DISCARD: u32 = 1 << 30;
        const HEADER: u64 = 8;
        let cons_pos = self.position(self.consumer);
        let prod_pos = self.position(self.producer);
        let data = self.producer.wrapping_add(self.page);
        let mut cons = cons_pos.load(Ordering::Relaxed);
        let prod = prod_pos.load(Ordering::Acquire);
        let mut out = Vec::new();
        while cons < prod {
            let at = (cons as usize) & (self.size - 1);
            // SAFETY: `at` is inside the first copy of the data area and
            // 8-aligned (records are); the header is a u32 the kernel
            // commits with a release store.
            let hdr = unsafe { &*(data.add(at) as *const AtomicU32) }.load(Ordering::Acquire);
            if hdr & BUSY != 0 {
                break; // reserved, not yet committed
            }
            let len = hdr & !(BUSY | DISCARD);
            if hdr & DISCARD == 0 && len == 8 {
                // SAFETY: an 8-byte committed record after the header,
                // inside the doubly mapped area.
                out.push(unsafe { std::ptr::read_unaligned(data.add(at + 8) as *const u64) });
            }
            cons += (HEADER + u64::from(len) + 7) & !7;
        }
        cons_pos.store(cons, Ordering::Release);
        out
    }
}

impl Drop for Bell {
    fn drop(&mut self) {
        // SAFETY: both mappings were made in `map` with these lengths and
        // nothing refers to them past this point.
        unsafe {
            libc::munmap(self.consumer.cast(), self.page);
            libc::munmap(self.producer.cast(), self.page + 2 * self.size);
        }
    }
}

/// A socket's cookie (`SO_COOKIE`): unique for the kernel's lifetime, the
/// same value `bpf_get_socket_cookie` returns in the program.
pub fn socket_cookie(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut cookie = 0u64;
    getsockopt(fd, libc::SOL_SOCKET, libc::SO_COOKIE, &mut cookie)?;
    Ok(cookie)
}

fn getsockopt<T>(fd: BorrowedFd<'_>, level: i32, name: i32, out: &mut T) -> io::Result<usize> {
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `out`, a valid,
    // writable T (plain data: integers and C structs only).
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (out as *mut T).cast(),
            &mut len,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(len as usize)
    }
}

/// `setsockopt` of one int option.
pub fn setsockopt_int(
    fd: BorrowedFd<'_>,
    level: i32,
    name: i32,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: setsockopt reads one c_int from the pointer we pass.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `TCP_INFO` of a socket (one snapshot, taken by the kernel under the
/// socket's lock).
pub fn tcp_info(fd: BorrowedFd<'_>) -> io::Result<libc::tcp_info> {
    // SAFETY: tcp_info is plain integers; all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut info)?;
    Ok(info)
}

/// Payload bytes ever written into the socket's send queue: sent once
/// (`bytes_sent - bytes_retrans`) plus not sent yet (`notsent_bytes`,
/// which is `write_seq - snd_nxt`). After `shutdown(SHUT_WR)` the FIN
/// takes one sequence number: while it is unsent it is the last of
/// `notsent_bytes`, so it is taken off; once sent it is in neither
/// `bytes_sent` (it has no payload) nor `notsent_bytes`.
pub fn written(info: &libc::tcp_info) -> u64 {
    const TCP_FIN_WAIT1: u8 = 4;
    const TCP_LAST_ACK: u8 = 9;
    const TCP_CLOSING: u8 = 11;
    let notsent = u64::from(info.tcpi_notsent_bytes);
    let fin_queued =
        notsent > 0 && matches!(info.tcpi_state, TCP_FIN_WAIT1 | TCP_LAST_ACK | TCP_CLOSING);
    (info.tcpi_bytes_sent - info.tcpi_bytes_retrans) + notsent - u64::from(fin_queued)
}

/// Whether the socket's receive side is shut: the peer's FIN (or a reset)
/// has been processed. A lockless read of `sk_shutdown`, via poll.
fn rdhup(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(p.revents & libc::POLLRDHUP != 0)
}

/// Payload received on the socket so far, with the FIN (which
/// `tcpi_bytes_received` counts as one byte) taken off. Read as shutdown
/// state, `TCP_INFO`, shutdown state until both agree: TCP records the
/// FIN in `bytes_received` before it marks the receive side shut, so a
/// shut side seen before the snapshot means the FIN is in it, and one seen
/// only after means it may be; then read again.
fn received(fd: BorrowedFd<'_>) -> io::Result<(u64, libc::tcp_info)> {
    for _ in 0..64 {
        let before = rdhup(fd)?;
        let info = tcp_info(fd)?;
        if rdhup(fd)? == before {
            let fin = u64::from(before);
            return Ok((info.tcpi_bytes_received.saturating_sub(fin), info));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::WouldBlock,
        "the receive side kept changing",
    ))
}

/// Bytes waiting in the socket's receive queue (`FIONREAD`). Meaningful
/// only for a socket in no map: in one, the kernel counts only the psock
/// queue.
fn unread(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD as _, &mut n) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as u64)
    }
}

/// Payload the proxy has taken off the socket itself: received minus what
/// is still queued. Read as queue, received, queue until both queue
/// readings agree: nothing else reads the socket, so only arrivals change
/// it, and they change `received` by as much.
fn consumed(fd: BorrowedFd<'_>) -> io::Result<u64> {
    for _ in 0..64 {
        let queued = unread(fd)?;
        let (received, _) = received(fd)?;
        if unread(fd)? == queued {
            return Ok(received.saturating_sub(queued));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::WouldBlock,
        "the receive queue kept changing",
    ))
}

/// What one direction had done when the pair was handed over.
#[derive(Clone, Copy, Debug)]
struct Base {
    /// `consumed` of the source: what the proxy had read itself.
    consumed: u64,
    /// `written` of the destination: what the proxy had written itself.
    written: u64,
}

/// One direction of a handed-over pair, as the kernel reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flow {
    /// Payload the kernel has written into the destination since the
    /// handoff: the byte count for metrics.
    pub delivered: u64,
    /// Taken off the source by the redirect and not yet written into the
    /// destination: queued on the destination's psock.
    pub in_flight: u64,
    /// Arrived on the source and not seen by the program yet: in TCP's
    /// receive queue, for an instant while redirecting, or for good after
    /// [`Redirected::stop`].
    pub held: u64,
    /// Kept on the source's psock after a stall (out of the copy path's
    /// reach, in order).
    pub kept: u64,
    /// Past the bell mark (or the handoff failed halfway): take the pair
    /// back now, while that is still lossless.
    pub warned: bool,
    /// At the budget (or the destination left the maps): from here on this
    /// direction's data is kept on the source; the connection must be
    /// reset.
    pub stalled: bool,
    /// The source's receive side is shut (FIN, or a reset).
    pub eof: bool,
}

impl Flow {
    /// Everything that arrived on the source has been written into the
    /// destination: after the source's FIN, the destination may be shut
    /// down now and nothing is lost.
    pub fn done(&self) -> bool {
        !self.stalled && self.in_flight == 0 && self.held == 0 && self.kept == 0
    }
}

impl Sockmap {
    /// Hands `a ⇄ b` to the kernel. The caller must hold no bytes read from
    /// one and not yet written to the other (its stages empty), must not
    /// read or write either socket while the pair is handed over, and then
    /// follows [`Redirected`]'s protocol. Both must be established TCP
    /// sockets (not past a FIN) without a ULP such as kTLS, in no map
    /// already: the kernel refuses others (`EOPNOTSUPP`, `EEXIST`).
    ///
    /// Whatever is queued on either socket goes out first, in order. On
    /// error nothing was redirected and nothing is left in the maps: the
    /// caller continues with its normal copy. (In the one case where the
    /// kernel refuses the second socket after taking the first, with bytes
    /// already in flight, the pair comes back [`Flow::warned`].)
    pub fn splice_pair<'s>(
        self: &Rc<Self>,
        a: BorrowedFd<'s>,
        b: BorrowedFd<'s>,
    ) -> io::Result<Redirected<'s>> {
        let cookies = [socket_cookie(a)?, socket_cookie(b)?];
        // Taken before the insertion, while only arrivals change the
        // sockets (and FIONREAD still counts TCP's queue).
        let base = [
            Base {
                consumed: consumed(a)?,
                written: written(&tcp_info(b)?),
            },
            Base {
                consumed: consumed(b)?,
                written: written(&tcp_info(a)?),
            },
        ];
        let mut pair = Redirected {
            map: self.clone(),
            socks: [a, b],
            cookies,
            base,
            inserted: [[false; 2]; 3],
            gave_up: false,
        };
        // Counts and targets first: once a socket is handed to the program,
        // its count and the socket it sends to are there. A failure up to
        // the first verdict insert redirected nothing; `pair` drops and
        // takes out what went in.
        for (i, fd) in [(0, b), (1, a)] {
            map_insert(&self.counts, cookies[i], &[0u64; 2])?;
            pair.inserted[COUNTS][i] = true;
            map_insert(&self.targets, cookies[i], &(fd.as_raw_fd() as u64))?;
            pair.inserted[TARGETS][i] = true;
        }
        map_insert(&self.verdict, cookies[0], &(a.as_raw_fd() as u64))?;
        pair.inserted[VERDICT][0] = true;
        if let Err(e) = map_insert(&self.verdict, cookies[1], &(b.as_raw_fd() as u64)) {
            // `a` may have redirected into `b` already. Nothing in flight:
            // a clean refusal. Else the pair cannot simply be dropped (the
            // bytes in flight would go): it is returned marked for taking
            // back, as after the bell.
            pair.stop()?;
            if pair.flows()?[0].in_flight == 0 {
                return Err(e);
            }
            pair.gave_up = true;
            return Ok(pair);
        }
        pair.inserted[VERDICT][1] = true;
        // Bytes that arrived before the insertion wait for a data-ready
        // call; setting SO_RCVLOWAT makes TCP re-check readiness and call
        // it now, so they go out ahead of anything newer.
        for s in [a, b] {
            let mut lowat: libc::c_int = 1;
            getsockopt(s, libc::SOL_SOCKET, libc::SO_RCVLOWAT, &mut lowat)?;
            setsockopt_int(s, libc::SOL_SOCKET, libc::SO_RCVLOWAT, lowat)?;
        }
        Ok(pair)
    }
}

const COUNTS: usize = 0;
const TARGETS: usize = 1;
const VERDICT: usize = 2;

/// A connection whose bytes the kernel moves. Core-local (`!Send`): it
/// belongs to the task that owns the two sockets.
///
/// The caller polls both sockets for `POLLRDHUP` only (the kernel wakes
/// `POLLIN` waiters on every redirected segment) and the core's
/// [`Sockmap::bell`] for `POLLIN`, and acts on:
/// - `POLLERR`: a reset. Drop the pair (everything leaves the maps), reset
///   the other side, close both.
/// - `POLLRDHUP` on a source whose [`Flow`] is [`done`](Flow::done): shut
///   the destination's write half. Until `done`, check again shortly (a
///   core timer, not a busy loop); the shut side stays shut, so stop
///   polling that source.
/// - the bell naming one of [`cookies`](Self::cookies) (or a [`Flow`]
///   read for another reason showing it): [`Flow::warned`]: take the pair
///   back: [`stop`](Self::stop), wait until nothing is
///   [`in_flight`](Flow::in_flight), [`finish`](Self::finish), and go on
///   with the copy path (which may hand the pair over again later, with a
///   fresh budget). [`Flow::stalled`]: the proxy did not take it back
///   before the budget ran out; bytes now wait on the source's psock, where
///   they cannot be handed back in order: reset the connection.
///
/// Dropping it takes both sockets out of the maps at once; bytes in flight
/// are then lost, which is right only for a reset.
pub struct Redirected<'s> {
    map: Rc<Sockmap>,
    socks: [BorrowedFd<'s>; 2],
    cookies: [u64; 2],
    base: [Base; 2],
    /// `[map][i]`: cookie `i` is in `counts`, `targets`, `verdict`.
    inserted: [[bool; 2]; 3],
    /// The handoff did not complete: report both directions warned.
    gave_up: bool,
}

impl<'s> Redirected<'s> {
    /// Both directions: `[a → b, b → a]`. Costs six system calls per
    /// direction; meant for events and timers, not per message.
    pub fn flows(&self) -> io::Result<[Flow; 2]> {
        let [a, b] = self.socks;
        Ok([self.flow(0, a, b)?, self.flow(1, b, a)?])
    }

    fn flow(&self, i: usize, src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> io::Result<Flow> {
        // Read so that neither figure is ever understated: the
        // destination before the count (it only grows toward the count),
        // the count before the source's arrivals (they only run ahead of
        // it). A reading can overstate, which a later one corrects.
        let delivered = written(&tcp_info(dst)?).saturating_sub(self.base[i].written);
        let [count, kept] = if self.inserted[COUNTS][i] {
            map_lookup(&self.map.counts, self.cookies[i])?
        } else {
            [0, 0]
        };
        let redirected = count & !STALLED;
        let (received, _) = received(src)?;
        let arrived = received.saturating_sub(self.base[i].consumed);
        let stalled = count & STALLED != 0;
        Ok(Flow {
            delivered,
            in_flight: redirected.saturating_sub(delivered),
            held: arrived.saturating_sub(redirected + kept),
            kept,
            warned: stalled || self.gave_up || redirected > self.map.limits.bell_at(),
            stalled,
            eof: rdhup(src)?,
        })
    }

    /// The source cookies of `a → b` and `b → a`: what the bell names.
    pub fn cookies(&self) -> [u64; 2] {
        self.cookies
    }

    /// Stops redirecting new data: both sockets leave the verdict map, so
    /// what arrives from now on stays in TCP's receive queues (and TCP's
    /// flow control holds the senders back). What the kernel already took
    /// keeps flowing to its destination.
    pub fn stop(&mut self) -> io::Result<()> {
        for i in 0..2 {
            if self.inserted[VERDICT][i] {
                map_delete(&self.map.verdict, self.cookies[i])?;
                self.inserted[VERDICT][i] = false;
            }
        }
        Ok(())
    }

    /// Blocks (sleeping 1 ms at a time) until nothing is in flight either
    /// way, for at most `within`. For tests and teardown; a core checks
    /// [`flows`](Self::flows) from its own timer instead.
    pub fn wait_drained(&self, within: Duration) -> io::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let [f, r] = self.flows()?;
            if f.in_flight == 0 && r.in_flight == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "redirected bytes still queued in the kernel: {} and {}",
                        f.in_flight, r.in_flight
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Takes the pair out of the maps for good; the bytes the kernel wrote
    /// `a → b` and `b → a`. Call after [`stop`](Self::stop) with nothing
    /// [`in_flight`](Flow::in_flight): then nothing is lost, the sockets
    /// are ordinary sockets again, and whatever arrived since `stop` waits
    /// in their receive queues for the copy path. While bytes are in
    /// flight, or for a stalled direction (its kept bytes would go: reset
    /// the connection instead), it refuses and gives the pair back as it
    /// was, still in the maps.
    pub fn finish(mut self) -> Result<[u64; 2], Unfinished<'s>> {
        let refuse = |pair, kind, msg: &str| {
            Err(Unfinished {
                pair,
                error: io::Error::new(kind, msg.to_owned()),
            })
        };
        if let Err(error) = self.stop() {
            return Err(Unfinished { pair: self, error });
        }
        let [f, r] = match self.flows() {
            Ok(flows) => flows,
            Err(error) => return Err(Unfinished { pair: self, error }),
        };
        if f.in_flight != 0 || r.in_flight != 0 {
            let msg = "redirected bytes still in flight: wait for them first";
            return refuse(self, io::ErrorKind::WouldBlock, msg);
        }
        if f.kept != 0 || r.kept != 0 {
            let msg = "a direction stalled: its bytes wait on the source's psock \
                       and cannot be handed back in order";
            return refuse(self, io::ErrorKind::InvalidData, msg);
        }
        self.remove();
        Ok([f.delivered, r.delivered])
    }

    /// Out of every map, targets and counts last.
    fn remove(&mut self) {
        let _ = self.stop();
        for m in [TARGETS, COUNTS] {
            let map = if m == TARGETS {
                &self.map.targets
            } else {
                &self.map.counts
            };
            for i in 0..2 {
                if self.inserted[m][i] {
                    let _ = map_delete(map, self.cookies[i]);
                    self.inserted[m][i] = false;
                }
            }
        }
    }
}

/// A [`Redirected::finish`] that could not be done: why, and the pair,
/// untouched.
pub struct Unfinished<'s> {
    pub pair: Redirected<'s>,
    pub error: io::Error,
}

impl fmt::Debug for Unfinished<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Unfinished({})", self.error)
    }
}

impl Drop for Redirected<'_> {
    fn drop(&mut self) {
        self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(i: Insn) -> [u8; 8] {
        // SAFETY: Insn is repr(C), 8 bytes of plain integers.
        unsafe { std::mem::transmute::<Insn, [u8; 8]>(i) }
    }

    /// The encodings, checked against the kernel's `struct bpf_insn`
    /// layout byte by byte (what `bpftool prog dump xlated` decodes).
    #[test]
    fn instruction_encodings() {
        use Reg::*;
        assert_eq!(size_of::<Insn>(), 8);
        // mov64 r6, r1: 0xbf, dst 6 | src 1 << 4.
        assert_eq!(
            bytes(Insn::mov64_reg(R6, R1)),
            [0xbf, 0x16, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            bytes(Insn::mov64_imm(R0, 1)),
            [0xb7, 0x00, 0, 0, 1, 0, 0, 0]
        );
        assert_eq!(
            bytes(Insn::add64_imm(R3, -8)),
            [0x07, 0x03, 0, 0, 0xf8, 0xff, 0xff, 0xff]
        );
        assert_eq!(
            bytes(Insn::add64_reg(R9, R7)),
            [0x0f, 0x79, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            bytes(Insn::or64_reg(R9, R1)),
            [0x4f, 0x19, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            bytes(Insn::lsh64_imm(R1, 63)),
            [0x67, 0x01, 0, 0, 63, 0, 0, 0]
        );
        // *(u64 *)(r10 - 8) = r0.
        assert_eq!(
            bytes(Insn::stx_dw(R10, -8, R0)),
            [0x7b, 0x0a, 0xf8, 0xff, 0, 0, 0, 0]
        );
        assert_eq!(
            bytes(Insn::ldx_w(R7, R6, SKB_LEN)),
            [0x61, 0x67, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            bytes(Insn::ldx_dw(R9, R8, 0)),
            [0x79, 0x89, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(bytes(Insn::call(72)), [0x85, 0, 0, 0, 72, 0, 0, 0]);
        assert_eq!(bytes(Insn::exit()), [0x95, 0, 0, 0, 0, 0, 0, 0]);
        // r2 = map fd 7: 0x18 with src = BPF_PSEUDO_MAP_FD, then an empty slot.
        let [lo, hi] = Insn::ld_map_fd(R2, 7);
        assert_eq!(bytes(lo), [0x18, 0x12, 0, 0, 7, 0, 0, 0]);
        assert_eq!(bytes(hi), [0; 8]);
        // r2 = 0x1_0000_0002: low half in the first slot, high in the second.
        let [lo, hi] = Insn::ld_imm64(R2, 0x1_0000_0002);
        assert_eq!(bytes(lo), [0x18, 0x02, 0, 0, 2, 0, 0, 0]);
        assert_eq!(bytes(hi), [0, 0, 0, 0, 1, 0, 0, 0]);
    }

    #[test]
    fn jumps_encode_their_test_and_count_from_the_next_instruction() {
        use Reg::*;
        let mut a = Asm::default();
        let l = a.label();
        a.jump(Some(Cond::EqImm(R7, 0)), l);
        a.jump(Some(Cond::NeImm(R0, 1)), l);
        a.jump(Some(Cond::SltImm(R9, 0)), l);
        a.jump(Some(Cond::GtReg(R1, R2)), l);
        a.jump(None, l);
        a.push([Insn::exit()]);
        a.place(l);
        a.push([Insn::exit()]);
        let p = a.finish();
        assert_eq!(bytes(p[0]), [0x15, 0x07, 5, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(p[1]), [0x55, 0x00, 4, 0, 1, 0, 0, 0]);
        assert_eq!(bytes(p[2]), [0xc5, 0x09, 3, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(p[3]), [0x2d, 0x21, 2, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(p[4]), [0x05, 0x00, 1, 0, 0, 0, 0, 0]);
    }

    #[test]
    #[should_panic(expected = "label placed")]
    fn a_jump_to_nowhere_is_caught() {
        let mut a = Asm::default();
        let l = a.label();
        a.jump(None, l);
        a.finish();
    }

    /// The program's shape: every exit returns a verdict set just before
    /// it, the three verdict paths are where the listing says, and every
    /// jump lands inside the program.
    #[test]
    fn program_paths() {
        let p = verdict_program(3, 4, 5, 1 << 20, 1 << 19);
        let n = p.len();
        assert_eq!(
            &p[n - 2..],
            &[Insn::mov64_imm(Reg::R0, SK_DROP), Insn::exit()]
        );
        assert_eq!(
            &p[n - 4..n - 2],
            &[Insn::mov64_imm(Reg::R0, SK_PASS), Insn::exit()]
        );
        // The empty-segment test jumps to the drop path.
        let zero = p
            .iter()
            .position(|i| i.code == BPF_JMP | BPF_JEQ | BPF_K)
            .unwrap();
        assert_eq!(zero + 1 + p[zero].off as usize, n - 2);
        for (at, i) in p.iter().enumerate() {
            let class = i.code & 0x07;
            let op = i.code & 0xf0;
            if class == BPF_JMP && op != BPF_CALL && op != BPF_EXIT {
                assert!(
                    at + 1 + (i.off as usize) < n,
                    "jump at {at} leaves the program"
                );
            }
            if i.code == BPF_JMP | BPF_EXIT {
                assert_eq!(p[at - 1].code, BPF_ALU64 | BPF_MOV | BPF_K, "exit at {at}");
            }
        }
        // The budget is the full 64-bit immediate.
        let [lo, hi] = Insn::ld_imm64(Reg::R2, 1 << 20);
        assert!(p.windows(2).any(|w| w == [lo, hi]));
    }

    #[test]
    fn written_takes_a_queued_fin_off() {
        // SAFETY: plain integers; zeroes are valid.
        let mut i: libc::tcp_info = unsafe { std::mem::zeroed() };
        i.tcpi_bytes_sent = 110;
        i.tcpi_bytes_retrans = 10;
        i.tcpi_notsent_bytes = 5;
        i.tcpi_state = 1; // established
        assert_eq!(written(&i), 105);
        i.tcpi_state = 4; // FIN_WAIT1: 4 bytes and the FIN unsent
        assert_eq!(written(&i), 104);
        i.tcpi_notsent_bytes = 0; // FIN sent: counted nowhere
        assert_eq!(written(&i), 100);
    }
}
