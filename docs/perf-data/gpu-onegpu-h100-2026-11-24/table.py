"""Medians over the interleaved repetitions of compare.sh's output, [min-max], and each NCCL
configuration's ratio to the socket backend at 1 channel x 16 sockets in the same repetition.
Usage: python3 table.py compare-*.jsonl"""
import json, statistics as st, sys
from collections import defaultdict
for path in sys.argv[1:]:
    rows = [json.loads(l) for l in open(path)]
    g = defaultdict(dict)  # (conf, bytes) -> rep -> gbps
    for r in rows:
        g[(r["conf"], r["bytes"])][r["rep"]] = r["gbps"]
    confs = list(dict.fromkeys(r["conf"] for r in rows))
    sizes = sorted({r["bytes"] for r in rows})
    print(f"{path}: GB/s, median [min-max] of {len({r['rep'] for r in rows})} repetitions")
    head = ["configuration"] + [f"{s >> 20} MiB" for s in sizes] + [f"socket-1x16 / it, {s >> 20} MiB" for s in sizes]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for c in confs:
        cells = [c]
        for s in sizes:
            v = list(g[(c, s)].values())
            cells.append(f"{st.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]")
        for s in sizes:
            ref = g.get(("socket-1x16", s), {})
            q = [ref[p] / x for p, x in g[(c, s)].items() if p in ref]
            cells.append(f"{st.median(q):.2f} [{min(q):.2f}-{max(q):.2f}]" if q and c != "socket-1x16" else "-")
        print("| " + " | ".join(cells) + " |")
    print()
