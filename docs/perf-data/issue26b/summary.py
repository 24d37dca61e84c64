import json, sys, statistics as st
rows=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by={(r["what"],r["streams"],r["rep"]):r for r in rows}
reps=sorted({r["rep"] for r in rows})
keys=[]
for r in rows:
    if (r["what"],r["streams"]) not in keys: keys.append((r["what"],r["streams"]))
print("reps:", len(reps), "| GPU wrong bytes:", sorted({str(r.get("wrong")) for r in rows if r["what"].startswith("gpu")}))
print("| run | K | GB/s median [min-max] | / yardstick median [min-max] | busy CPUs | ctxt per GB | process sys CPU-s per GB | process user CPU-s per GB | process ctxt switches per GB |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for w,k in sorted(keys,key=lambda x:(x[1],x[0]!="c_free",x[0])):
    v=[by[(w,k,p)] for p in reps if (w,k,p) in by]
    g=[r["gbps"] for r in v]
    q=[by[(w,k,p)]["gbps"]/by[("c_free",k,p)]["gbps"] for p in reps if (w,k,p) in by and ("c_free",k,p) in by]
    rs="%.2f [%.2f-%.2f]"%(st.median(q),min(q),max(q)) if q and w!="c_free" else "-"
    cpg=st.median([r["ctxt_per_s"]/max(r["gbps"],0.01) for r in v])
    def per_gb(f):
        x=[f(r)/r["gb"] for r in v if "sys_s" in r and r.get("gb")]
        return "%.3f"%st.median(x) if x else "-"
    print("| %s | %d | %.2f [%.2f-%.2f] | %s | %.1f | %d | %s | %s | %s |"%(w,k,st.median(g),min(g),max(g),rs,st.median([r["busy_cpus"] for r in v]),cpg,
        per_gb(lambda r:r["sys_s"]), per_gb(lambda r:r["user_s"]), per_gb(lambda r:r["nvcsw"]+r["nivcsw"])))
# K=16 against K=8, per repetition
for w in ("w8","w32"):
    q=[by[(w,16,p)]["gbps"]/by[(w,8,p)]["gbps"] for p in reps if (w,16,p) in by and (w,8,p) in by]
    if q: print("%s: K=16 / K=8 per repetition: %s" % (w, " ".join("%.2f"%x for x in q)))
