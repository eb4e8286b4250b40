"""Where the overlapped step's time goes, from one traced run of this folder's command.

    python analyse.py FOLDER      # FOLDER: results.json.gz, trace.rank0.json.gz, threads.jsonl.gz

Per run (plain Horovod, hvd.overlap): s/step; the job's CPU per step split into its ranks'
two busiest threads (TensorFlow's inter-op threads: the compute) and all other threads
(Horovod's background thread with Gloo, the runtime's and Python's threads); the link's
payload bytes per second over its rate (``link_samples``). Per overlapped training call
(from one Begin to the next, rank 0's trace): the time no gradient chunk is in flight
(no ``allreduce`` span open) and its longest stretch.
The thread samples were taken every 0.25 s by threads_sampler.py beside the run.
"""
import gzip
import json
import re
import statistics as st
import sys

D = sys.argv[1]
res = json.load(gzip.open(D + "/results.json.gz"))
recs = [json.loads(line) for line in gzip.open(D + "/threads.jsonl.gz", "rt")]
for r in res["runs"]:
    j = r["jobs"][0]
    steps = [s for s in j["steps"] if not s["warmup"]]
    t0, t1 = steps[0]["t_start"], steps[-1]["t_end"]
    per = (t1 - t0) / len(steps)
    sel = [x for x in recs if t0 <= x["t"] <= t1]
    a, b = sel[0], sel[-1]
    dt = b["t"] - a["t"]
    comp = other = 0.0
    for pid, th in b["p"].items():
        if pid not in a["p"] or len(th) < 3:
            continue
        cpu = sorted(((th[t][1] - a["p"][pid].get(t, ["", 0])[1]) / dt * per for t in th),
                     reverse=True)
        comp, other = comp + sum(cpu[:2]), other + sum(cpu[2:])
    ls = [x for x in r["link_samples"] if t0 <= x[0] <= t1]
    rate = float(re.match(r"(\d+)mbit", r["rate"]).group(1)) * 1e6 / 8
    busy = (ls[-1][1] - ls[0][1]) / (ls[-1][0] - ls[0][0]) / rate
    print(f"{j['impl']:8s} overlap={j['meta'].get('overlap')}: {per:.3f} s/step; job CPU/step: "
          f"inter-op threads {comp:.3f} s, other threads {other:.3f} s; link busy {busy:.1%}")

d = json.load(gzip.open(D + "/trace.rank0.json.gz"))
evs = d["traceEvents"] if isinstance(d, dict) else d
begins = sorted(e["ts"] for e in evs if e.get("name", "").startswith("begin"))
spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in evs if e.get("cat") == "chunk"
               and e.get("ph") == "X" and e.get("tid") == "allreduce")
gaps = []
for k in range(4, len(begins) - 1):            # steady calls: after warmup, before the last
    b0, b1 = begins[k], begins[k + 1]
    last, idle, longest = b0, 0.0, 0.0
    for s, e in sorted((max(s, b0), min(e, b1)) for s, e in spans if e > b0 and s < b1):
        if s > last:
            idle += s - last
            longest = max(longest, s - last)
        last = max(last, e)
    if last < b1:
        idle += b1 - last
        longest = max(longest, b1 - last)
    gaps.append(((b1 - b0) / 1e3, idle / 1e3, longest / 1e3))
    print(f"call {k}: {gaps[-1][0]:.0f} ms, no chunk in flight {gaps[-1][1]:.0f} ms "
          f"(longest stretch {gaps[-1][2]:.0f} ms)")
print(f"median over {len(gaps)} calls: call {st.median(g[0] for g in gaps):.0f} ms, no chunk in "
      f"flight {st.median(g[1] for g in gaps):.0f} ms")
