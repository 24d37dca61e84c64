"""Prints `tcpx-run validate --json`'s document as lines a person reads: the status, per
collective, size and arm the busbw with its interval and the gain, and NCCL's log evidence with
its warnings. Used by validate-onegpu.sh and closed-loop.sh.

    python3 validate-summary.py PREFIX FILE    (PREFIX starts every line, e.g. "== ")
"""
import json
import sys

prefix, path = sys.argv[1], sys.argv[2]
try:
    v = json.load(open(path))
except Exception as e:
    print(f"{prefix}no JSON document from validate: {e}")
    sys.exit(0)
print(f"{prefix}status {v['status']}; {v['found']}")
for n in v.get("net_plugin", []):
    print(f"{prefix}{n}")
for c in v["collectives"]:
    if c["status"] != "measured":
        print(f"{prefix}{c['collective']}: {c['status']}: {c.get('reason')}")
        continue
    for s in c["sizes"]:
        f = lambda a: (f"{s[a]['median']:.2f} [{s[a]['ci95_lo']:.2f}, {s[a]['ci95_hi']:.2f}]"
                       if s.get(a) else "-")
        g = (f"{s['gain']:.3f} [{s['gain_lo']:.3f}, {s['gain_hi']:.3f}]"
             if s.get("gain") is not None else "-")
        print(f"{prefix}{c['collective']:9} {s['size']:>10} default {f('default')} tuned {f('tuned')} gain {g}")
    for e in c.get("evidence", []):
        print(f"{prefix}{c['collective']:9} {e['arm']:7} log: network {'+'.join(e['networks'])}, "
              f"nNodes {e['nodes']}, read {e['read']}")
        for p in e["problems"]:
            print(f"{prefix}WARNING {p}")
