# Runs a command and samples /proc/<pid>/task/*/stat every 20 ms until it exits; prints the
# command's last stdout line, then one JSON line of CPU seconds (user, sys) per thread group:
# send threads (tcpx-send-*, ys-tx-*), receive threads (tcpx-recv-*, ys-rx-*), the rest.
import json, os, subprocess, sys, time
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE)
last = {}
hz = os.sysconf("SC_CLK_TCK")
while p.poll() is None:
    try:
        for t in os.listdir("/proc/%d/task" % p.pid):
            try:
                s = open("/proc/%d/task/%s/stat" % (p.pid, t)).read()
            except OSError:
                continue
            name = s[s.index("(") + 1:s.rindex(")")]
            f = s[s.rindex(")") + 2:].split()
            last[t] = (name, int(f[11]) / hz, int(f[12]) / hz)
    except OSError:
        pass
    time.sleep(0.02)
out = p.stdout.read().decode().strip().splitlines()
groups = {"send": [0.0, 0.0], "recv": [0.0, 0.0], "other": [0.0, 0.0]}
for name, u, s in last.values():
    g = "send" if name.startswith(("tcpx-send", "ys-tx")) else "recv" if name.startswith(("tcpx-recv", "ys-rx")) else "other"
    groups[g][0] += u; groups[g][1] += s
print(out[-1] if out else "{}")
print(json.dumps({k: {"user_s": round(v[0], 3), "sys_s": round(v[1], 3)} for k, v in groups.items()}))
