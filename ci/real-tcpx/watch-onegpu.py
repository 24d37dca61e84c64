#!/usr/bin/env python3
"""The watch shim in front of Google's GPUDirect-TCPX plugin, under torch.distributed on ONE GPU
as two NCCL hosts (issue 41): correctness, the shim's bytes against what the job moved, and the
shim's overhead, interleaved against the same job without it.

Each run is a fresh pair of rank processes (NCCL reads its environment once): send/recv rank 0 ->
rank 1 (bytes verified), then all-reduce (sum, checked), WARMUP + ITERS of each, timed after the
warm-up. Arms alternate per repetition: `plain` (NCCL_NET_PLUGIN = the plugin) and `shim`
(NCCL_NET_PLUGIN=tcpxwatch from SHIM_DIR, TCPX_WATCH_INNER = the plugin, TCPX_WATCH_DIR per run).
Both pin NCCL_NET=GPUDirectTCPX_v7 (the shim carries the plugin's name, so a fallback fails the
run instead of being measured) and NCCL_PROTO=Simple, so that the bytes on the network are the
payload: rank 0 sends (WARMUP+ITERS) x SIZE for send/recv plus SIZE per all-reduce (two ranks:
ring or tree alike), rank 1 SIZE per all-reduce; ranks meet at the TCP store, never through NCCL,
so nothing else crosses the network. The shim's send bytes must equal these exactly; its receive
bytes are what NCCL posted (GPUDirect-TCPX reports no receive sizes), at least the payload.

  watch-onegpu.py OUT_DIR PLUGIN_SO SHIM_DIR [--sizes 1048576,268435456] [--reps 3]
                  [--iters 1M=40,256M=8] [--warmup 2] [--tcpx-run BIN]

Prints one JSON line per run ({"measure":"run",...}) and a summary per size
({"measure":"summary",...}: medians, overhead %, bytes exact in every shim run), then a final
{"measure":"verdict",...}. With --tcpx-run, `tcpx-run watch` is run on one shim run's directory
and its output saved beside it.
"""
import json, os, re, socket, statistics, subprocess, sys, time

ONE_M = 1 << 20


def rank_main():
    import torch, torch.distributed as dist
    from torch.distributed import distributed_c10d
    rank = int(os.environ["RANK"]); size = int(os.environ["SIZE"])
    iters = int(os.environ["ITERS"]); warmup = int(os.environ["WARMUP"])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", 0))
    store = distributed_c10d._get_default_store()

    def meet(name):  # a barrier through the TCP store: no byte through NCCL's network
        store.add(name, 1)
        deadline = time.time() + 120
        while int(store.add(name, 0)) < 2:
            if time.time() > deadline:
                raise RuntimeError(f"rank {rank}: peer never reached {name}")
            time.sleep(0.0005)

    n = size // 4
    buf = torch.empty(n, dtype=torch.float32, device="cuda")
    ref = torch.arange(n, dtype=torch.float32, device="cuda") % 251

    def p2p():
        if rank == 0:
            dist.send(ref, 1)
        else:
            dist.recv(buf, 0)

    for _ in range(warmup):
        p2p()
    torch.cuda.synchronize(); meet("p2p")
    t = time.perf_counter()
    for _ in range(iters):
        p2p()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / iters
    ok = True if rank == 0 else bool(torch.equal(buf, ref))
    a = torch.full((n,), float(rank + 1), device="cuda")
    for _ in range(warmup):
        a.fill_(float(rank + 1)); dist.all_reduce(a)
    torch.cuda.synchronize()
    ar_ok = bool(torch.all(a == 3.0))
    meet("ar")
    t = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(a)
    torch.cuda.synchronize()
    ar_dt = (time.perf_counter() - t) / iters
    ops = warmup + iters
    print(json.dumps({"rank": rank, "sendrecv_busbw_gbs": size / dt / 1e9, "verified": ok,
                      "allreduce_busbw_gbs": size / ar_dt / 1e9,  # 2(n-1)/n = 1 at n = 2
                      "allreduce_correct": ar_ok,
                      "payload_sent": (ops * size if rank == 0 else 0) + ops * size}),
          flush=True)
    meet("end")
    dist.destroy_process_group()


def shim_bytes(run_dir, pids):
    """Per rank (by pid): bytes sent and received over its comms in the last interval, per NIC,
    set-up times, and whether every file ended cleanly."""
    out = {"ranks": {}, "per_nic": {}, "ended": True, "files": 0}
    if not os.path.isdir(run_dir):
        return out
    for name in sorted(os.listdir(run_dir)):
        if not name.endswith(".jsonl"):
            continue
        out["files"] += 1
        lines = []
        for p in (os.path.join(run_dir, name + ".1"), os.path.join(run_dir, name)):
            if os.path.exists(p):
                lines += [json.loads(l) for l in open(p) if l.strip()]
        start = next((l for l in lines if l["kind"] == "start"), {})
        nics = {d["dev"]: d["name"] for d in start.get("devices", [])}
        last = next((l for l in reversed(lines) if l["kind"] == "interval"), {"comms": []})
        out["ended"] &= bool(lines) and lines[-1]["kind"] == "end"
        rank = pids.get(start.get("pid"), f"pid{start.get('pid')}")
        r = out["ranks"].setdefault(str(rank), {"send": 0, "recv": 0, "comms": 0,
                                                "setup_s_max": 0.0, "api": start.get("api"),
                                                "inner_name": start.get("inner_name")})
        for c in last["comms"]:
            r[c["dir"]] += c["bytes"]; r["comms"] += 1
            r["posted_sized"] = r.get("posted_sized", 0) + c.get("posted_sized", 0)
            nic = out["per_nic"].setdefault(nics.get(c["dev"], str(c["dev"])), {"send": 0, "recv": 0})
            nic[c["dir"]] += c["bytes"]
        for l in lines:
            if l["kind"] == "conn" and l.get("call") in ("connect", "accept"):
                r["setup_s_max"] = max(r["setup_s_max"], l["took_s"])
    return out


def one_run(out, arm, rep, size, iters, warmup, plugin, shim_dir):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    tag = f"{arm}-{size >> 20}M-r{rep}"
    watch = os.path.join(out, "watch", tag)
    extra = {"NCCL_NET": "GPUDirectTCPX_v7", "NCCL_PROTO": "Simple"}
    if arm == "shim":
        extra.update(NCCL_NET_PLUGIN="tcpxwatch", TCPX_WATCH_INNER=plugin, TCPX_WATCH_DIR=watch,
                     TCPX_WATCH_INTERVAL_MS="1000",
                     LD_LIBRARY_PATH=shim_dir + ":" + os.environ.get("LD_LIBRARY_PATH", ""))
    else:
        extra.update(NCCL_NET_PLUGIN=plugin)
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, ONEGPU_RANK_CHILD="1", RANK=str(rank), SIZE=str(size),
                   ITERS=str(iters), WARMUP=str(warmup), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   NCCL_HOSTID=f"tcpx-lab-watch-{rank}", NCCL_NVLS_ENABLE="0",
                   NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ENV,NET",
                   NCCL_DEBUG_FILE=f"{out}/logs/{tag}-rank{rank}.log", **extra)
        procs.append(subprocess.Popen([sys.executable, __file__], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    res = {"measure": "run", "arm": arm, "rep": rep, "size": size, "iters": iters}
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        outs = [p.communicate() for p in procs]
        res["error"] = "timed out after 120 s"
    ranks = {}
    for i, (o, _) in enumerate(outs):
        line = [l for l in o.splitlines() if l.startswith("{")]
        if line:
            ranks[i] = json.loads(line[-1])
    if 1 in ranks and 0 in ranks:
        res.update({k: ranks[1][k] for k in ("sendrecv_busbw_gbs", "verified",
                                             "allreduce_busbw_gbs", "allreduce_correct")})
        res["expected_sent"] = {"0": ranks[0]["payload_sent"], "1": ranks[1]["payload_sent"]}
    elif "error" not in res:
        res["error"] = (outs[0][1] + outs[1][1])[-1000:]
    logs = ""
    for rank in (0, 1):
        try:
            logs += open(f"{out}/logs/{tag}-rank{rank}.log").read()
        except OSError:
            pass
    res["network"] = sorted(set(re.findall(r"Using network (\S+)", logs)))
    res["watch_log_line"] = bool(re.search(r"NET/tcpxwatch : wrapping", logs))
    if arm == "shim":
        sb = shim_bytes(watch, {procs[0].pid: 0, procs[1].pid: 1})
        res["shim"] = sb
        exp = res.get("expected_sent", {})
        got = {r: v["send"] for r, v in sb["ranks"].items()}
        recv = {r: v["recv"] for r, v in sb["ranks"].items()}
        # Each rank's sent bytes are exactly what it sent. GPUDirect-TCPX reports no receive
        # sizes, so a receive counts what NCCL posted (a whole step): at least what arrived.
        res["bytes_exact"] = bool(exp) and sb["ended"] and got == exp
        res["recv_covers_sent"] = (bool(exp) and recv.get("1", 0) >= exp.get("0", 0)
                                   and recv.get("0", 0) >= exp.get("1", 0))
        res["watch_dir"] = watch
    print(json.dumps(res), flush=True)
    return res


def main():
    if os.environ.get("ONEGPU_RANK_CHILD") == "1":
        return rank_main()
    out, plugin, shim_dir = os.path.abspath(sys.argv[1]), sys.argv[2], os.path.abspath(sys.argv[3])
    sizes, reps, warmup, tcpx_run = [ONE_M, 256 * ONE_M], 3, 2, None
    iters = {ONE_M: 40, 256 * ONE_M: 8}
    args = sys.argv[4:]; i = 0
    while i < len(args):
        k, v = args[i], args[i + 1]; i += 2
        if k == "--sizes": sizes = [int(x) for x in v.split(",")]
        elif k == "--reps": reps = int(v)
        elif k == "--warmup": warmup = int(v)
        elif k == "--tcpx-run": tcpx_run = v
        elif k == "--iters":
            for kv in v.split(","):
                s, n = kv.split("="); iters[int(s[:-1]) * ONE_M if s.endswith("M") else int(s)] = int(n)
        else: sys.exit(f"unknown argument {k}")
    os.makedirs(f"{out}/logs", exist_ok=True)
    runs = []
    for size in sizes:
        for rep in range(reps):
            order = ("plain", "shim") if rep % 2 == 0 else ("shim", "plain")  # interleaved
            for arm in order:
                runs.append(one_run(out, arm, rep, size, iters.get(size, 10), warmup, plugin, shim_dir))
    all_exact, all_ok = True, True
    for size in sizes:
        mine = [r for r in runs if r["size"] == size and "error" not in r]
        summary = {"measure": "summary", "size": size}
        for op in ("sendrecv_busbw_gbs", "allreduce_busbw_gbs"):
            med = {a: statistics.median([r[op] for r in mine if r["arm"] == a] or [float("nan")])
                   for a in ("plain", "shim")}
            summary[op] = med
            summary[op.replace("_busbw_gbs", "_overhead_pct")] = (med["plain"] - med["shim"]) / med["plain"] * 100
        shim_runs = [r for r in mine if r["arm"] == "shim"]
        summary["bytes_exact_runs"] = f'{sum(r.get("bytes_exact", False) for r in shim_runs)}/{len(shim_runs)}'
        summary["recv_covers_sent_runs"] = f'{sum(r.get("recv_covers_sent", False) for r in shim_runs)}/{len(shim_runs)}'
        summary["correct_runs"] = f'{sum(r.get("verified", False) and r.get("allreduce_correct", False) for r in mine)}/{len(mine)}'
        summary["networks"] = sorted({n for r in mine for n in r["network"]})
        summary["failed_runs"] = len([r for r in runs if r["size"] == size and "error" in r])
        all_exact &= bool(shim_runs) and all(r.get("bytes_exact") for r in shim_runs)
        all_ok &= bool(mine) and summary["failed_runs"] == 0 and all(
            r.get("verified") and r.get("allreduce_correct") for r in mine)
        print(json.dumps(summary), flush=True)
    verdict = {"measure": "verdict", "correct": all_ok, "bytes_exact": all_exact}
    if tcpx_run:
        shim_run = next((r for r in runs if r["arm"] == "shim" and "error" not in r), None)
        if shim_run:
            p = subprocess.run([tcpx_run, "watch", shim_run["watch_dir"]], capture_output=True,
                               text=True, timeout=120)
            with open(f"{out}/tcpx-run-watch.txt", "w") as f:
                f.write(p.stdout + p.stderr)
            verdict["tcpx_run_watch"] = {"exit": p.returncode, "file": f"{out}/tcpx-run-watch.txt"}
    print(json.dumps(verdict), flush=True)
    sys.exit(0 if all_ok and all_exact else 1)


if __name__ == "__main__":
    main()
