# The table of final.sh and profile.sh: medians, ratios to the same repetition's c_free, CPU per
# GB and CPUs busy. usage: table.py ROWS.jsonl [RUN...]: for each RUN also its K=16 / K=8 ratio.
import json, sys, statistics as st
rows=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by={(r["what"],r["streams"],r["rep"]):r for r in rows}
reps=sorted({r["rep"] for r in rows}); keys=[]
for r in rows:
    if (r["what"],r["streams"]) not in keys: keys.append((r["what"],r["streams"]))
print("| run | K | GB/s median [min-max] | / c_free median [min-max] | CPU-s per GB | CPUs busy (CPU-s/GB x GB/s) | ctxt sw per GB (C) |")
print("|---|---:|---:|---:|---:|---:|---:|")
med=lambda v: "%.3f"%st.median(v) if v else "-"
for w,k in sorted(keys,key=lambda x:(x[1],not x[0].startswith("c_"),x[0])):
    v=[by[(w,k,p)] for p in reps if (w,k,p) in by]
    g=[r["gbps"] for r in v]
    q=[by[(w,k,p)]["gbps"]/by[("c_free",k,p)]["gbps"] for p in reps if (w,k,p) in by and ("c_free",k,p) in by]
    print("| %s | %d | %.2f [%.2f-%.2f] | %s | %s | %s | %s |"%(w,k,st.median(g),min(g),max(g),
      "%.2f [%.2f-%.2f]"%(st.median(q),min(q),max(q)) if q and w!="c_free" else "-",
      med([r["cpu_s_per_gb"] for r in v if r.get("cpu_s_per_gb")]), med([r["busy_cpus"] for r in v if r.get("busy_cpus")]),
      med([r["csw_per_gb"] for r in v if "csw_per_gb" in r])))
for w in sys.argv[2:]:
    q=[by[(w,16,p)]["gbps"]/by[(w,8,p)]["gbps"] for p in reps if (w,16,p) in by and (w,8,p) in by]
    if q: print("%s: K=16 / K=8 per repetition: %s" % (w, " ".join("%.2f"%x for x in q)))
print("GPU wrong bytes:", sorted({str(r.get("wrong")) for r in rows if r["what"].startswith("gpu")}))
