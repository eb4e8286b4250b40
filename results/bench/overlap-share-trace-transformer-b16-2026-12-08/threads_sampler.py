"""Sample per-thread CPU (utime+stime ticks) of every benchmarks.workload process every 0.25 s."""
import os, sys, time, json
out = open(sys.argv[1], "w")
hz = os.sysconf("SC_CLK_TCK")
stop = time.time() + float(sys.argv[2])
while time.time() < stop:
    rec = {"t": time.time(), "p": {}}
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")
        except OSError: continue
        if b"benchmarks.workload" not in cmd or b"horovodrun" in cmd or b"mpirun" in cmd: continue
        th = {}
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                s = open(f"/proc/{pid}/task/{tid}/stat").read()
                name = s[s.index("(")+1:s.rindex(")")]
                f = s[s.rindex(")")+2:].split()
                th[tid] = [name, (int(f[11]) + int(f[12])) / hz]
        except OSError: continue
        rec["p"][pid] = th
    out.write(json.dumps(rec) + "\n"); out.flush()
    time.sleep(0.25)
