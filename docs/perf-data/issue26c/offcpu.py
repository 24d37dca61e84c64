"""Off-CPU time of a system-wide sched:sched_switch record: for each thread switched out while not
runnable (prev_state != R), the time until it is switched in again, keyed by its thread group and
the kernel function it blocked in. usage: perf script -F comm,tid,time,event,trace,ip,sym | offcpu.py TIDFILE NAME SECS BYTES"""
import sys, re, collections, json
tids = {int(x) for x in open(sys.argv[1]).read().split() if x.isdigit()}
name, secs, nbytes = sys.argv[2], float(sys.argv[3]), float(sys.argv[4]); gb = nbytes / 1e9
def group(c):
    if c.startswith("ys-tx") or c.startswith("tcpx-send"): return "send"
    if c.startswith("ys-rx") or c.startswith("tcpx-recv"): return "recv"
    return None
KEYS = ["sk_stream_wait_memory", "sk_wait_data", "do_sys_poll", "futex_wait", "do_nanosleep", "__lock_sock", "lock_sock_nested", "mutex_lock", "ep_poll", "do_select"]
out_at = {}; off = collections.Counter(); cnt = collections.Counter(); preempt = collections.Counter(); first = last = None
ev = None
def handle(ev):
    global first, last
    t, trace, frames = ev
    first = t if first is None else first; last = t
    m = re.search(r"prev_comm=(.*?) prev_pid=(\d+) prev_prio=\d+ prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)", trace)
    if not m: return
    pc, pp, st, nc, np_ = m.group(1), int(m.group(2)), m.group(3), m.group(4), int(m.group(5))
    g = group(pc) if pp in tids else None
    if g:
        if st.startswith("R"):
            preempt[g] += 1
        else:
            why = next((k for k in KEYS if k in frames), frames[1] if len(frames) > 1 else "?")
            out_at[pp] = (t, g, why); cnt[(g, why)] += 1
    if np_ in out_at:
        t0, g2, why = out_at.pop(np_); off[(g2, why)] += t - t0
for line in sys.stdin:
    s = line.rstrip("\n")
    if not s.strip():
        if ev: handle(ev)
        ev = None; continue
    if ev is None:
        m = re.match(r"\s*(.*?)\s+(\d+)\s+(\d+\.\d+):\s+sched:sched_switch:\s+(.*)$", s)
        ev = (float(m.group(3)), m.group(4), []) if m else (0.0, "", [])
        continue
    p = s.split(None, 1)
    if len(p) == 2: ev[2].append(p[1].split("+0x")[0].strip())
if ev: handle(ev)
span = (last - first) if first is not None and last and last > first else secs
print(json.dumps({"name": name, "secs": secs, "gb": round(gb, 3),
    "off_cpu_thread_s_per_s": {"%s:%s" % k: round(v / span, 3) for k, v in off.most_common(20)},
    "blocks_per_gb": {"%s:%s" % k: round(v / gb) for k, v in cnt.most_common(20)},
    "preemptions_per_gb": {k: round(v / gb) for k, v in preempt.items()}}))
