#!/usr/bin/env python3
"""Self-time breakdown of one ringway process from `perf script -F
comm,tid,time,ip,sym,dso` output with DWARF callchains.

Every sample goes to one category, decided by its leaf frame, except:
- kernel leaves that only mark where interrupts or bottom halves were
  re-enabled (cpu-clock sampling in a VM lands there: _raw_spin_unlock_irqrestore,
  __local_bh_enable_ip, handle_softirqs, ...) go to the first caller that is not one;
- libc memcpy/memmove/memset leaves go to the copy they perform, read from the
  (inlined) callers: TLS read-ahead -> rustls deframer, rustls decrypted record ->
  plaintext queue, rustls plaintext -> h2 read buffer, h2 payload -> rustls record."""
import sys, re, collections, json

def parse(stream):
    sample = None
    for line in stream:
        line = line.rstrip('\n')
        if not line.strip():
            if sample is not None:
                yield sample
            sample = None
            continue
        if not line.startswith((' ', '\t')):
            sample = {'head': line, 'frames': []}
            continue
        if sample is None:
            continue
        m = re.match(r'\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$', line)
        if m:
            sym = re.sub(r'\+0x[0-9a-f]+$', '', m.group(2))
            sample['frames'].append((sym, m.group(3), m.group(1)))
    if sample is not None:
        yield sample

def is_kernel(dso):
    return 'kernel.kallsyms' in dso

# Leaves that stand for "the region that had interrupts/BHs off ends here".
K_SKID = re.compile(r'^(_raw_spin_unlock_irqrestore|_raw_spin_unlock_irq|_raw_spin_unlock_bh|_raw_spin_unlock|_raw_spin_lock\w*|__local_bh_enable_ip|local_bh_enable|handle_softirqs|do_softirq\w*|__do_softirq|__irq_exit_rcu|irq_exit_rcu|native_queued_spin_lock_slowpath|__pv_queued_spin_lock_slowpath|queued_spin_lock_slowpath|__rcu_read_lock|__rcu_read_unlock|preempt_count_\w+|lock_sock_nested|release_sock|__release_sock)$')
K_COPY = re.compile(r'^(rep_movs_alternative|copy_user_generic\w*|copy_user_enhanced\w*|_copy_to_iter|_copy_from_iter|__copy_to_iter|__copy_from_iter|copy_to_user\w*|copy_from_user\w*|skb_copy_datagram_iter|__skb_datagram_iter|simple_copy_to_iter|copy_page_to_iter|copy_page_from_iter\w*|skb_do_copy_data_nocache|skb_copy_to_page_nocache|_copy_to_user|_copy_from_user|__check_object_size\w*|check_heap_object|__virt_addr_valid|check_stack_object)$')
K_MEMCPY = re.compile(r'^(memcpy|__memcpy|memcpy_orig|memmove|__memmove|memset|__memset|memset_orig|clear_page\w*)$')
K_WAKE = re.compile(r'^(sock_def_readable|sock_def_write_space|sk_stream_write_space|__wake_up\w*|wake_up\w*|try_to_wake_up|ttwu_\w+|autoremove_wake_function|default_wake_function|select_task_rq\w*|enqueue_\w+|__enqueue_entity|place_entity|check_preempt\w*|wakeup_preempt\w*|resched_curr|__resched_curr|native_smp_send_reschedule|kick_process|__smp_call\w*|ep_poll_callback|pollwake)$')
K_SCHED = re.compile(r'^(schedule\w*|__schedule|dequeue_\w+|__dequeue_entity|update_curr\w*|update_load_avg|update_cfs\w*|pick_next\w*|pick_task\w*|finish_task_switch\w*|__switch_to\w*|switch_mm\w*|psi_\w+|set_next_entity|put_prev\w*|reweight\w*|__update_load\w*|prepare_task_switch|raw_spin_rq\w*|sched_\w+|avg_vruntime\w*|update_min_vruntime|hrtick\w*|__calc_delta\w*|native_sched_clock|sched_clock\w*|update_rq_clock\w*|update_se\w*|newidle_balance|sched_balance\w*|cpuacct\w*|__cgroup_account\w*|cgroup_rstat\w*|__wrgsbase_inactive|mm_cid\w*|native_write_msr|rb_erase|rb_insert\w*|rb_next|__rb_\w+|vruntime\w*|entity_\w+|io_schedule\w*|update_entity\w*|account_\w+|__account\w*|task_tick\w*|tick_\w+|__hrtimer\w*|hrtimer_\w+|get_nohz\w*|irqtime_\w+)$')
K_URING = re.compile(r'^(io_\w+|__io_\w+|__do_sys_io_uring\w*|__x64_sys_io_uring\w*|tctx_task_work\w*|task_work_run|llist_reverse_order|__arm_poll\w*|vfs_poll|sock_poll|tcp_poll|__pollwait)$')
K_NET = re.compile(r'^(tcp\w*|__tcp\w*|ip\w*|__ip\w*|inet\w*|__inet\w*|sk_\w+|__sk_\w+|skb_\w+|__skb\w*|kfree_skb\w*|__kfree_skb\w*|consume_skb\w*|napi_\w+|__napi\w*|net_\w+|__net\w*|netif_\w+|__netif\w*|dev_\w+|__dev_\w+|veth_\w+|nf_\w+|__nf_\w+|nft_\w+|__nft\w*|process_backlog|sock_\w+|__sock\w*|raw_\w+|validate_xmit\w*|__qdisc\w*|qdisc_\w+|sch_direct\w*|pfifo\w*|eth_\w+|neigh_\w+|__neigh\w*|fib_\w+|__fib\w*|dst_\w+|__dst\w*|csum_\w+|__csum\w*|do_csum|bbr_\w+|cubictcp\w*|minmax_\w+|__build_skb\w*|build_skb\w*|alloc_skb\w*|gro_\w+|__gro\w*|rps_\w+|enqueue_to_backlog|get_rps_cpu|hash_conntrack\w*|ipv4_\w+|bpf_\w+|__bpf\w*|sk_filter\w*|mod_timer|__mod_timer|lock_timer_base|timer_\w+|detach_if_pending|enqueue_timer|__timer\w*|internal_add_timer|calc_wheel_index|loopback_xmit|__xfrm\w*|xfrm\w*|page_frag\w*|__page_frag\w*|get_netmem|put_netmem|netmem_\w+|__netmem\w*|mptcp\w*|__mptcp\w*|__cgroup_bpf\w*|cgroup_bpf\w*|security_sock\w*|security_socket\w*|apparmor_socket\w*|usecs_to_jiffies|__usecs_to_jiffies|ktime_get\w*|read_tsc|kvm_clock\w*|pvclock\w*|lock_sock\w*|__lock_sock|__sys_sendto|__sys_recvfrom|__sys_sendmsg|___sys_sendmsg|____sys_sendmsg|__x64_sys_sendto|__x64_sys_recvfrom|__x64_sys_sendmsg)$')
K_MEM = re.compile(r'^(kmem_cache_\w+|__kmem_cache\w*|__kmalloc\w*|kmalloc\w*|kfree\w*|__kfree\w*|__alloc_pages\w*|alloc_pages\w*|__alloc_frozen\w*|alloc_frozen\w*|get_page_from_freelist|free_unref\w*|free_frozen\w*|__free_frozen\w*|__free_pages\w*|free_pcppages_bulk|rmqueue\w*|__rmqueue\w*|__folio_put|folio_\w+|__put_page|put_page|__mod_memcg\w*|mod_memcg\w*|memcg_\w+|__memcg\w*|obj_cgroup\w*|refill_obj\w*|consume_obj\w*|try_charge\w*|mem_cgroup\w*|__mem_cgroup\w*|page_counter\w*|drain_obj\w*|__slab\w*|slab_\w+|___slab\w*|alloc_slab\w*|kmalloc_reserve|__mod_lruvec\w*|mod_objcg\w*|lruvec_\w+|__mod_node\w*|mod_node\w*|__mod_zone\w*|zone_\w+|free_pages\w*|__free_one_page|get_pfnblock\w*|__get_pfnblock\w*|split_page\w*|handle_mm_fault|__handle_mm_fault|do_user_addr_fault|exc_page_fault|asm_exc_page_fault|do_anonymous_page|__do_fault|do_fault|do_wp_page|vma_\w+|lock_vma\w*|mas_\w+|zap_\w+|unmap_\w+|tlb_\w+|flush_tlb\w*|native_flush_tlb\w*|do_madvise\w*|__x64_sys_madvise|pte_\w+|__pte\w*|set_pte\w*|clear_page\w*|__memcg_slab\w*|page_pool\w*|__page_pool\w*|__refill_stock|refill_stock|__lruvec_stat\w*|free_tail_page\w*|__list_del\w*|__list_add\w*)$')
K_ENTRY = re.compile(r'^(entry_SYSCALL\w*|syscall_\w+|do_syscall_64|x64_sys_call|__x64_sys_\w+|__sys_\w+|__do_sys_\w+|____sys_\w+|___sys_\w+|fdget\w*|__fget\w*|fput\w*|__fdget\w*|sockfd_lookup_light|import_\w+|copy_msghdr\w*|__copy_msghdr\w*|rw_verify_area|security_\w+|apparmor_\w+|exit_to_user_mode\w*|irqentry_\w+|arch_exit_to_user_mode\w*|__rseq\w*|rseq_\w+|restore_fpregs\w*|fpregs\w*|switch_fpu\w*|clear_bhb\w*|srso_\w+|__x86_return_thunk|entry_untrain_ret|__put_user\w*|__get_user\w*|__cond_resched|mutex_\w+|__mutex\w*|ksys_\w+|vfs_\w+|sock_read_iter|sock_write_iter|get_signal|__task_pid_nr_ns|asm_sysvec\w*|sysvec_\w+)$')

def kclass(sym):
    if K_COPY.match(sym): return 'k: socket copies (copy_to/from_user + usercopy checks)'
    if K_MEMCPY.match(sym): return 'k: other memcpy/memset'
    if K_WAKE.match(sym): return 'k: wake-ups (sock_def_readable, try_to_wake_up)'
    if K_SCHED.match(sym): return 'k: scheduler, context switch, timers'
    if K_URING.match(sym): return 'k: io_uring (enter, poll, task work)'
    if K_NET.match(sym): return 'k: TCP/IP, veth/loopback, softirq'
    if K_MEM.match(sym): return 'k: memory (slab, page alloc, memcg, faults)'
    if K_ENTRY.match(sym): return 'k: syscall entry/exit, fd lookup'
    return 'k: other'

def kernel_cat(frames):
    kf = [re.sub(r'\.(isra|part|constprop|cold)\.\d+', '', f[0]).replace('.isra', '').replace('.part', '') for f in frames if is_kernel(f[1])]
    if kf and kf[0] in ('irqentry_exit_to_user_mode', 'irqentry_exit', 'exit_to_user_mode_loop') and len(kf) > 1 and kf[1].startswith(('asm_sysvec', 'sysvec_')):
        # An interrupt (reschedule IPI, timer) taken in user mode: what shows
        # here is its handling, irqs off.
        return 'k: scheduler, context switch, timers'
    for i, sym in enumerate(kf):
        if K_SKID.match(sym):
            if sym == 'handle_softirqs' or sym.startswith('do_softirq') or sym == '__irq_exit_rcu':
                # A softirq ran here: what it did is below us (we are its caller
                # chain); the samples that land on the re-enable are net rx.
                rest = kf[i+1:i+4]
                if any(r.startswith(('asm_sysvec', 'sysvec_')) for r in rest):
                    return 'k: scheduler, context switch, timers'
                return 'k: TCP/IP, veth/loopback, softirq'
            continue
        return kclass(sym)
    return 'k: other'

LIBC_MEM = re.compile(r'^(__memmove\w*|__memcpy\w*|memcpy\w*|memmove\w*|__memset\w*|memset\w*|__mempcpy\w*)$')
ALLOC = re.compile(r'(_rjem_|\bje_|jemalloc|^malloc$|^free$|^realloc$|^calloc$|^sdallocx$|^__rust_alloc|^__rust_dealloc|^__rust_realloc|^__rdl_|^_int_malloc|^_int_free|^__libc_malloc|^__libc_free|^cfree)')
RING = re.compile(r'ring_core_0_17_\d+__(\w+)|^ring::')

def crate_of(sym):
    s = sym.lstrip('<&').replace('impl ', '')
    m = re.match(r'([A-Za-z_][A-Za-z0-9_]*)::', s)
    return m.group(1) if m else None

def mem_cat(sym, frames):
    chain = ' '.join(f[0] for f in frames[1:40])
    if 'ralloc' in chain.split(' alloc::')[0] and ('_rjem_' in chain[:200] or 'do_rallocx' in chain[:300]):
        return 'u: memcpy, buffer growth (realloc)'
    kind = 'memset' if 'memset' in sym else 'memcpy'
    if kind == 'memset':
        if 'prepare_read' in chain or 'DeframerVecBuffer' in chain:
            return 'u: memset, rustls deframer buffer growth'
        return 'u: memset, other'
    if 'drain_ahead' in chain:
        return 'u: memcpy RX, TLS read-ahead -> rustls deframer'
    if 'take_received_plaintext' in chain:
        return 'u: memcpy RX, decrypted record -> rustls plaintext queue'
    if 'OutboundChunks' in chain or 'send_appdata' in chain or 'copy_to_vec' in chain:
        return 'u: memcpy TX, h2 payload -> rustls record (before seal)'
    if 'put_slice' in chain and ('poll_read' in chain) and ('h2::' in chain or 'poll_read_buf' in chain):
        return 'u: memcpy RX, rustls plaintext -> h2 read buffer'
    if 'h2::' in chain:
        return 'u: memcpy, h2 frame encode/other'
    if 'ReadSizer' in chain or 'socket_to_stream' in chain or 'read_into' in chain:
        return 'u: memcpy, pump'
    if 'ralloc' in chain or 'realloc' in chain or 'grow' in chain:
        return 'u: memcpy, buffer growth (realloc)'
    return 'u: memcpy, other'

JEMALLOC_INNER = re.compile(r'^(cache_bin\w*|phn_\w+|extent_\w+|edata_\w+|eset_\w+|sz_\w+|te_\w+|tcache\w*|malloc_mutex\w*|imalloc\w*|free_fastpath|emap_\w+|arena_\w+|tsd_\w+|do_rallocx|aligned_usize_get|atomic_load_\w|background_thread\w*|___pthread_mutex_trylock|lll_mutex_unlock\w*|__GI___pthread_mutex\w*|ifree|isfree|iralloc\w*|large_\w+|pac_\w+|pai_\w+|hpa_\w+|sec_\w+|ecache_\w+|rtree_\w+|witness_\w+|prof_\w+|thread_\w+_event|bin_\w+|slab_\w+)$')

def user_cat(frames):
    addr = frames[0][2]
    group = [f for f in frames if f[2] == addr]
    names = [f[0] for f in group]
    if any(RING.search(n) or re.match(r'(seal|open)_(whole|finish|strided)|.*vclmulavx2|.*aes::hw', n) for n in names):
        joined = ' '.join(names)
        if 'ghash' in joined and 'aes_gcm' not in joined:
            return 'u: GHASH (ring, outside the stitched AES-GCM loop)'
        return 'u: AES-GCM (ring)'
    if any(LIBC_MEM.match(n) for n in names):
        return mem_cat([n for n in names if LIBC_MEM.match(n)][0], frames[len(group)-1:])
    if any(ALLOC.search(n) or JEMALLOC_INNER.match(n) for n in names):
        return 'u: allocator (jemalloc)'
    if any('clock_gettime' in n or 'Timespec' in n for n in names):
        return 'u: executor + io_uring reactor'
    real = [f for f in group if f[1] != 'inlined']
    sym, dso = (real[0][0], real[0][1]) if real else (frames[0][0], frames[0][1])
    m = RING.search(sym)
    if m:
        name = m.group(1) or sym
        if 'ghash' in name or 'gmult' in name:
            return 'u: GHASH (ring, outside the stitched AES-GCM loop)'
        if 'aes' in name or 'gcm' in name or sym.startswith(('ring::aead',)):
            return 'u: AES-GCM (ring)'
        return 'u: ring, other'
    if ALLOC.search(sym):
        return 'u: allocator (jemalloc)'
    if LIBC_MEM.match(sym):
        return mem_cat(sym, frames)
    c = crate_of(sym)
    if c == 'h2' or c == 'tokio_util':
        return 'u: h2 framing and streams'
    if c == 'rustls':
        return 'u: rustls record handling'
    if c == 'tokio_rustls':
        return 'u: tokio-rustls glue'
    if c == 'ringway_dataplane':
        if '::io::executor' in sym or '::io::uring' in sym or 'app::cores' in sym:
            return 'u: executor + io_uring reactor'
        return 'u: ringway pump, stream, sockets'
    if c == 'bytes':
        return 'u: bytes'
    if 'libc' in dso:
        return 'u: libc syscall wrappers'
    if c == 'std' and ('backtrace' in sym or 'rust_begin' in sym):
        return 'u: executor + io_uring reactor'
    return 'u: other (std, core, futures)'

def classify(frames):
    if not frames:
        return 'u: other (std, core, futures)'
    if is_kernel(frames[0][1]):
        return kernel_cat(frames)
    return user_cat(frames)

def main():
    cats = collections.Counter(); total = 0
    for s in parse(sys.stdin):
        cats[classify(s['frames'])] += 1; total += 1
    k = sum(v for c, v in cats.items() if c.startswith('k:'))
    print(json.dumps({'samples': total, 'kernel_pct': round(100.0*k/total, 2),
                      'cats': {c: round(100.0*v/total, 2) for c, v in sorted(cats.items())}}, indent=1))

if __name__ == '__main__':
    main()
