"""Folds `perf script -F comm,tid,ip,sym` of a system-wide cpu-clock profile into CPU per GB moved.
usage: perf script ... | python3 fold.py NAME HZ SECS BYTES NCPU OUTDIR"""
import sys, collections, json, gzip, re
name, hz, secs, nbytes, ncpu, outdir = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
gb = nbytes / 1e9
INCL = ["_copy_to_iter", "_copy_from_iter", "tcp_sendmsg_locked", "tcp_recvmsg_locked", "sk_stream_wait_memory",
        "release_sock", "__release_sock", "net_rx_action", "tcp_v4_rcv", "tcp_ack", "tcp_write_xmit", "__tcp_transmit_skb",
        "do_sys_poll", "schedule", "__schedule", "try_to_wake_up", "sock_def_readable", "sk_wait_data", "tcp_rcv_space_adjust",
        "skb_release_data", "__kfree_skb", "skb_page_frag_refill", "sk_page_frag_refill", "__alloc_pages_noprof", "alloc_pages_mpol",
        "__sk_mem_raise_allocated", "__sk_mem_reduce_allocated", "tcp_cleanup_rbuf", "exc_page_fault", "futex_wait", "futex_wake",
        "tcp_rcv_established", "tcp_data_queue", "tcp_clean_rtx_queue", "skb_copy_datagram_iter", "__check_object_size",
        "do_softirq", "__local_bh_enable_ip", "handle_softirqs", "ksys_write", "ksys_read", "do_writev", "__sys_recvfrom", "__sys_sendto",
        "lock_sock_nested", "__lock_sock", "tcp_stream_alloc_skb", "skb_attempt_defer_free", "skb_defer_free_flush", "sock_rfree", "tcp_wfree",
        "pvclock_clocksource_read", "read_tsc", "__pv_queued_spin_lock_slowpath", "native_queued_spin_lock_slowpath"]
def group(c):
    if c.startswith("swapper"): return "idle"
    if c.startswith("ys-tx") or c.startswith("tcpx-send"): return "send"
    if c.startswith("ys-rx") or c.startswith("tcpx-recv"): return "recv"
    if c.startswith("ksoftirqd"): return "ksoftirqd"
    if c in ("yard", "tcpx-run") or c.startswith("tcpx"): return "proc-other"
    return "other:" + c
grp = collections.Counter(); sysc = collections.Counter(); leaf = collections.Counter(); incl = collections.Counter()
folded = collections.Counter(); comms = collections.Counter(); n = 0
def flush(c, frames):
    global n
    g = group(c); grp[g] += 1; comms[c] += 1
    if g == "idle" or g.startswith("other:"): return
    n += 1
    sc = "user"
    for i, f in enumerate(frames):
        if f == "do_syscall_64": sc = frames[i - 1] if i else f; break
        if f == "asm_exc_page_fault": sc = "page_fault"; break
        if f.startswith("asm_sysvec") or f.startswith("asm_common_interrupt"): sc = "irq"; break
        if f in ("ret_from_fork", "ret_from_fork_asm", "kthread"): sc = "kthread"; break
    sysc[(g, sc)] += 1
    lf = frames[0] if frames else "?"
    if "spin_unlock" in lf and len(frames) > 1: lf = lf + "<" + frames[1]
    leaf[(g, lf)] += 1
    for f in set(frames) & set(INCL): incl[(g, f)] += 1
    folded[re.sub(r"\d+", "N", c) + ";" + ";".join(reversed(frames))] += 1
comm = None; frames = []
for line in sys.stdin:
    s = line.rstrip("\n")
    if not s.strip():
        if comm is not None: flush(comm, frames)
        comm = None; frames = []; continue
    if comm is None:
        comm = s.strip().rsplit(None, 1)[0] if len(s.split()) > 1 else s.strip(); continue
    p = s.split(None, 1)
    if len(p) == 2: frames.append(p[1].split("+0x")[0].strip())
if comm is not None: flush(comm, frames)
ms = lambda v: round(v / hz / gb * 1000, 2)
out = {"name": name, "secs": secs, "gb": round(gb, 3), "gbps": round(gb / secs, 3), "hz": hz, "ncpu": ncpu,
       "cpu_s_per_gb": round(n / hz / gb, 4), "cpus_busy": round(n / hz / secs, 2), "cpus_idle": round(grp["idle"] / hz / secs, 2),
       "groups_ms_per_gb": {g: ms(v) for g, v in grp.most_common()},
       "syscall_ms_per_gb": {"%s:%s" % k: ms(v) for k, v in sysc.most_common(30)},
       "leaf_ms_per_gb": {"%s:%s" % k: ms(v) for k, v in leaf.most_common(60)},
       "inclusive_ms_per_gb": {"%s:%s" % k: ms(v) for k, v in sorted(incl.items(), key=lambda x: -x[1])},
       "top_comms_samples": dict(comms.most_common(12))}
print(json.dumps(out))
with gzip.open("%s/%s.folded.gz" % (outdir, name), "wt") as f:
    for k, v in folded.most_common():
        f.write("%s %d\n" % (k, v))
