"""What benchmark_tcpx_lab.py and benchmark_nccl.py share: sizes, the pattern, the table.

The table is `tcpx-run bench`'s (nccl-tests style): GB/s = 1e9 bytes/s, busbw = algbw for
point-to-point, one row per size and side, `#wrong` the received bytes that differ from the
pattern (checked on the last iteration of each size)."""

import argparse
import json
import math
import os
import statistics

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s):
    s = s.strip().upper().rstrip("B")
    if s and s[-1] in UNITS:
        return int(float(s[:-1]) * UNITS[s[-1]])
    return int(s)


def parse_sizes(spec):
    """`1K..1G` (doubling), `1M,4M`, or one size."""
    out = []
    for part in spec.split(","):
        if ".." in part:
            lo, hi = (parse_size(x) for x in part.split(".."))
            n = lo
            while n <= hi:
                out.append(n)
                n *= 2
        else:
            out.append(parse_size(part))
    return out


def common_args(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", choices=["cpu", "gpu"], default="gpu")
    p.add_argument("--local-gpu-idx", type=int, default=None,
                   help="GPU to use (default: LOCAL_RANK under torchrun, else 0)")
    p.add_argument("--num-cpus", type=int, default=4)
    p.add_argument("--sizes", default="1K..1G", help="1K..1G (doubling), 1M,4M, or one size")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    return p


def gpu_index(args):
    if args.local_gpu_idx is not None:
        return args.local_gpu_idx
    return int(os.environ.get("LOCAL_RANK", "0"))


def shared_gpu_host_ids(ranks):
    """The NCCL_HOSTID of each of `ranks` rank processes sharing one GPU: distinct, so NCCL's host
    hashes differ and it treats them as nodes of their own (it refuses two ranks on one GPU only
    within one host). The same ids as tcpx_transport::nccl::shared_gpu_host_ids."""
    return [f"tcpx-lab-host{r}" for r in range(ranks)]


def nccl_placement(gpus, rank, world, local_world, wanted_gpu):
    """Where an NCCL rank goes: (gpu, NCCL_HOSTID to set or None, what the output says).

    One GPU per rank where the node has enough (`wanted_gpu`, LOCAL_RANK by default). Where a
    single node (world == local_world) has fewer GPUs than ranks, each rank runs on `wanted_gpu`
    when it exists, else GPU 0, as an NCCL host of its own, and NCCL carries the bytes over its
    network transport ("1 GPU as 2 NCCL hosts"). Raises ValueError without any GPU."""
    if gpus < 1:
        raise ValueError("no GPU here: --device cpu runs gloo instead")
    if world != local_world or gpus >= local_world:
        return wanted_gpu, None, f"GPU {wanted_gpu} of rank {rank}"
    gpu = wanted_gpu if wanted_gpu < gpus else 0
    ids = shared_gpu_host_ids(world)
    where = f"1 GPU as {world} NCCL hosts (GPU {gpu}" if gpus == 1 else \
        f"{gpus} GPUs as {world} NCCL hosts (rank {rank} on GPU {gpu}"
    return gpu, ids[rank], f"{where}, NCCL_HOSTID " + " and ".join(ids) + ")"


def fill(t, size, seed):
    """Pattern bytes into uint8 tensor `t` (torch, any device)."""
    import torch

    i = torch.arange(size, dtype=torch.int64, device=t.device)
    t.copy_(((i * 2654435761 + seed * 977 + size) >> 7).to(torch.uint8))


def wrong_bytes(t, size, seed):
    import torch

    want = torch.empty_like(t)
    fill(want, size, seed)
    return int((t != want).sum().item())


def header(tool, role, peer, args, transport):
    lines = [
        f"# {tool}  role {role}  peer {peer}",
        f"# transport {transport}  memory {'cuda:' + str(gpu_index(args)) if args.device == 'gpu' else 'host'}"
        f"  channels {getattr(args, 'num_cpus', 1)}",
        f"# warmup {args.warmup}  iters {args.iters}  verify on  (GB/s = 1e9 bytes/s; busbw = algbw for send/recv)",
        "#",
        "#  columns 1-9 as nccl-tests (this row's side: recv = what arrived); after #wrong: p50/p99, sender time/algbw, side",
        "#{:>12} {:>12} {:>8} {:>6} {:>6} {:>10} {:>8} {:>8} {:>7} {:>10} {:>10} {:>10} {:>8} {:>5}".format(
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "p50", "p99",
            "s_time", "s_algbw", "side"),
        "#{:>12} {:>12} {:>8} {:>6} {:>6} {:>10} {:>8} {:>8} {:>7} {:>10} {:>10} {:>10} {:>8} {:>5}".format(
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(GB/s)", ""),
    ]
    return "\n".join(lines)


def summarize(size, side, times_s, wrong):
    """One side's row figures from per-iteration times (seconds)."""
    us = sorted(t * 1e6 for t in times_s)
    avg = statistics.fmean(us)
    p99 = us[min(len(us) - 1, int(round(0.99 * (len(us) - 1))))]
    gbs = size / (avg * 1e-6) / 1e9
    return {"size": size, "side": side, "avg_us": avg, "p50_us": statistics.median(us),
            "p99_us": p99, "algbw_gbs": gbs, "busbw_gbs": gbs, "wrong": wrong}


# The fastest link a figure may claim (10 TB/s) and the longest time (a week): the bounds of
# tcpx_model::FASTEST_BYTES_PER_S and LONGEST_SECONDS, which every Rust boundary checks too.
FASTEST_BYTES_PER_S = 1e13
LONGEST_S = 7 * 24 * 3600.0


def _check_row(r, size, side):
    """Why row `r` cannot be `side`'s real measurement of `size` bytes per iteration, or None."""
    if not isinstance(r, dict):
        return f"a row that is not a row ({type(r).__name__})"
    got = r.get("size")
    if isinstance(got, bool) or not isinstance(got, int) or got != size:
        return f"a row of {got!r} B where {size} B were asked"
    if r.get("side") != side:
        return f"a {r.get('side')!r} row where a {side} row was due"
    floor = size / FASTEST_BYTES_PER_S
    for k in ("avg_us", "p50_us", "p99_us"):
        v = r.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v <= 0 or v / 1e6 > LONGEST_S:
            return f"{k} {v!r} at {size} B is not a time (finite, positive, at most a week)"
        if v / 1e6 < floor:
            return f"{k} {v!r} us for {size} B is faster than any link ({FASTEST_BYTES_PER_S / 1e12:g} TB/s)"
    for k in ("algbw_gbs", "busbw_gbs"):
        v = r.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v < 0 or v * 1e9 > FASTEST_BYTES_PER_S:
            return f"{k} {v!r} at {size} B is not a rate any link has (0 to {FASTEST_BYTES_PER_S / 1e9:g} GB/s)"
    w = r.get("wrong")
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= size):
        return f"{w!r} wrong bytes of {size} at {size} B"
    return None


def check_pair(send_rows, recv_rows, sizes):
    """Checks the rows each rank reported (they cross a process or host boundary) against the
    `sizes` asked: one row per size, in order, of that size and side; times finite, positive and
    not below what the bytes need at the fastest link; rates finite, not negative, not beyond it;
    wrong bytes within the size. Raises ValueError naming the rank whose figures are impossible."""
    for rows, side, who in ((send_rows, "send", "rank 1 (the sender)"),
                            (recv_rows, "recv", "rank 0 (the receiver)")):
        if not isinstance(rows, list) or len(rows) != len(sizes):
            n = len(rows) if isinstance(rows, list) else type(rows).__name__
            raise ValueError(f"{who} reported impossible figures: {n} rows for the {len(sizes)} sizes asked")
        for r, size in zip(rows, sizes):
            why = _check_row(r, size, side)
            if why is not None:
                raise ValueError(f"{who} reported impossible figures: {why}")


def row(r, sender=None):
    """One row per size in nccl-tests' columns (`r`: the receiver's figures where known), with
    the sender's time and algbw after #wrong when `sender` is given."""
    wrong = "N/A" if r["wrong"] is None else str(r["wrong"])
    s_time = "-" if sender is None else "{:.1f}".format(sender["avg_us"])
    s_algbw = "-" if sender is None else "{:.2f}".format(sender["algbw_gbs"])
    return " {:>12} {:>12} {:>8} {:>6} {:>6} {:>10.1f} {:>8.2f} {:>8.2f} {:>7} {:>10.1f} {:>10.1f} {:>10} {:>8} {:>5}".format(
        r["size"], r["size"], "uint8", "none", -1, r["avg_us"], r["algbw_gbs"], r["busbw_gbs"], wrong,
        r["p50_us"], r["p99_us"], s_time, s_algbw, r["side"])


def print_pair(header_lines, send_rows, recv_rows, json_path):
    """Prints both ranks' rows under `header_lines`, a row per size (the receiver's figures with
    the sender's time after #wrong), then the footer; writes every row, sender then receiver per
    size, to `json_path` when one is given."""
    print(header_lines)
    both = []
    for s, r in zip(send_rows, recv_rows):
        print(row(r, s))
        both += [s, r]
    print(footer(both))
    write_json(json_path, both)


def write_json(path, rows):
    """Writes `rows` as JSON to `path` (nothing when `path` is empty)."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


def footer(rows):
    recv = [r for r in rows if r["side"] == "recv"]
    wrong = sum(r["wrong"] or 0 for r in recv)
    avg = statistics.fmean(r["busbw_gbs"] for r in recv) if recv else 0.0
    oob = f"{wrong} OK" if wrong == 0 else f"{wrong} FAILED"
    return (f"# Out of bounds values : {oob}\n# Avg bus bandwidth    : {avg:.3f} \n#\n"
            f"# Wrong bytes : {wrong}")
