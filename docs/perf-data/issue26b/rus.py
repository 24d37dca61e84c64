# Runs a command, passes its stdout through, and appends to $RUS_OUT one JSON line with the
# child's CPU seconds (user, sys), voluntary and involuntary context switches, and wall time.
import json, os, resource, subprocess, sys, time
t0 = time.time()
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE)
wall = time.time() - t0
r = resource.getrusage(resource.RUSAGE_CHILDREN)
sys.stdout.buffer.write(p.stdout)
with open(os.environ["RUS_OUT"], "w") as f:
    json.dump({"user_s": r.ru_utime, "sys_s": r.ru_stime, "nvcsw": r.ru_nvcsw, "nivcsw": r.ru_nivcsw, "wall_s": wall}, f)
sys.exit(p.returncode)
