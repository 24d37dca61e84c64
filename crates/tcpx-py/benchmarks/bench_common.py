"""What benchmark_tcpx_lab.py and benchmark_nccl.py share: sizes, the pattern, the table.

The table is `tcpx-run bench`'s (nccl-tests style): GB/s = 1e9 bytes/s, busbw = algbw for
point-to-point, one row per size and side, `#wrong` the received bytes that differ from the
pattern (checked on the last iteration of each size)."""

import argparse
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
        "#{:>12} {:>12} {:>6} {:>6} {:>5} {:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>7}".format(
            "size", "count", "type", "redop", "root", "side", "time", "p50", "p99", "algbw", "busbw", "#wrong"),
        "#{:>12} {:>12} {:>6} {:>6} {:>5} {:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>7}".format(
            "(B)", "(elements)", "", "", "", "", "(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", ""),
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


def row(r):
    wrong = "N/A" if r["wrong"] is None else str(r["wrong"])
    return " {:>12} {:>12} {:>6} {:>6} {:>5} {:>5} {:>10.1f} {:>10.1f} {:>10.1f} {:>8.2f} {:>8.2f} {:>7}".format(
        r["size"], r["size"], "uint8", "none", -1, r["side"], r["avg_us"], r["p50_us"], r["p99_us"],
        r["algbw_gbs"], r["busbw_gbs"], wrong)


def footer(rows):
    recv = [r for r in rows if r["side"] == "recv"]
    wrong = sum(r["wrong"] or 0 for r in recv)
    avg = statistics.fmean(r["busbw_gbs"] for r in recv) if recv else 0.0
    return f"# Wrong bytes : {wrong}\n# Avg bus bandwidth (recv) : {avg:.3f} GB/s"
