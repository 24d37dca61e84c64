#!/usr/bin/env python3
"""NCCL between two processes on ONE GPU, as two NCCL hosts, through torch.distributed.

NCCL refuses two ranks on one GPU only when their host hashes match; each rank here gets its own
NCCL_HOSTID, so NCCL sees two nodes and uses its network transport: NET/Socket by default, or a
net plugin (NCCL_NET_PLUGIN=..., NCCL_NET_GDR_LEVEL=LOC where devmem is absent). Each arm is a
fresh pair of processes (NCCL reads its environment once per process); arms run interleaved,
REPS times. Per run: send/recv busbw (GB/s = 1e9 bytes/s, receiver, bytes verified) and an
all-reduce (sum, checked) busbw as nccl-tests counts it (2(n-1)/n x algbw), plus what NCCL's own
log says: the network used and every "set by environment to" line.

  onegpu-nccl.py OUT_DIR ARM=KEY=VAL,KEY=VAL ... [--reps N] [--size BYTES] [--iters N]

Prints one JSON line per run and writes each rank's NCCL log under OUT_DIR.
"""
import json, os, re, socket, subprocess, sys, time

def rank_main():
    import torch, torch.distributed as dist
    rank = int(os.environ["RANK"]); size = int(os.environ["SIZE"]); iters = int(os.environ["ITERS"])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", 0))
    n = size // 4
    buf = torch.empty(n, dtype=torch.float32, device="cuda")
    ref = torch.arange(n, dtype=torch.float32, device="cuda") % 251
    def p2p():
        if rank == 0:
            dist.send(ref, 1)
        else:
            dist.recv(buf, 0)
    p2p(); torch.cuda.synchronize(); dist.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        p2p()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / iters
    ok = True if rank == 0 else bool(torch.equal(buf, ref))
    a = torch.full((n,), float(rank + 1), device="cuda")
    dist.all_reduce(a); torch.cuda.synchronize()
    ar_ok = bool(torch.all(a == 3.0))
    dist.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(a)
    torch.cuda.synchronize()
    ar_dt = (time.perf_counter() - t) / iters
    if rank == 1:
        print(json.dumps({"sendrecv_busbw_gbs": size / dt / 1e9, "verified": ok,
                          "allreduce_busbw_gbs": size / ar_dt / 1e9 * 2 * (2 - 1) / 2,
                          "allreduce_correct": ar_ok}), flush=True)
    dist.destroy_process_group()

def evidence(log):
    net = sorted(set(re.findall(r"Using network (\S+)", log)))
    env = sorted(set(re.findall(r"(NCCL_\w+) set by environment to (\S+)", log)))
    nodes = sorted(set(re.findall(r"nNodes (\d+)", log)))
    return {"network": net, "set_by_environment": [f"{k}={v}" for k, v in env], "nNodes": nodes}

def main():
    if os.environ.get("ONEGPU_RANK_CHILD") == "1":
        return rank_main()
    out = sys.argv[1]; os.makedirs(out, exist_ok=True)
    arms, reps, size, iters = [], 3, 256 << 20, 10
    args = sys.argv[2:]; i = 0
    while i < len(args):
        if args[i] == "--reps": reps = int(args[i + 1]); i += 2; continue
        if args[i] == "--size": size = int(args[i + 1]); i += 2; continue
        if args[i] == "--iters": iters = int(args[i + 1]); i += 2; continue
        name, _, kv = args[i].partition("=")
        arms.append((name, dict(p.split("=", 1) for p in kv.split(",") if p))); i += 1
    for rep in range(reps):
        order = arms[rep % len(arms):] + arms[:rep % len(arms)]  # rotating, interleaved
        for name, extra in order:
            s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
            procs = []
            for rank in (0, 1):
                env = dict(os.environ, ONEGPU_RANK_CHILD="1", RANK=str(rank), SIZE=str(size),
                           ITERS=str(iters), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port), NCCL_HOSTID=f"tcpx-lab-onegpu-{rank}",
                           NCCL_NVLS_ENABLE="0", NCCL_DEBUG="INFO",
                           NCCL_DEBUG_SUBSYS="INIT,ENV,NET",
                           NCCL_DEBUG_FILE=f"{out}/{name}-r{rep}-rank{rank}.log", **extra)
                procs.append(subprocess.Popen([sys.executable, __file__], env=env,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True))
            res = {"arm": name, "rep": rep, "env": extra}
            try:
                outs = [p.communicate(timeout=120) for p in procs]
            except subprocess.TimeoutExpired:
                for p in procs: p.kill()
                outs = [p.communicate() for p in procs]
                res["error"] = "timed out after 120 s"
            line = [l for l in outs[1][0].splitlines() if l.startswith("{")]
            if line: res.update(json.loads(line[-1]))
            elif "error" not in res:
                res["error"] = (outs[0][1] + outs[1][1])[-800:]
            logs = ""
            for rank in (0, 1):
                try: logs += open(f"{out}/{name}-r{rep}-rank{rank}.log").read()
                except OSError: pass
            res["nccl_log"] = evidence(logs)
            print(json.dumps(res), flush=True)

if __name__ == "__main__":
    main()
