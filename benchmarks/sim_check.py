"""The simulator's prediction of a testbed run, side by side with the measurement.

    python -m benchmarks.sim_check results/cluster/identical-1gbit-b1024 \\
        --profile results/sim/profile_mlp_b1024.json

Reads the runner's ``results.json`` (``benchmarks.cluster``), rebuilds the same
jobs in the simulator (2 workers each, the uplink's rate in each direction =
topology "nic", the jobs' start offsets, classes and steps), and runs every
variant the testbed ran: ``hvd`` as Horovod (FIFO), ``prio`` as horovod_prio
without an arbiter (priority release + the adaptive policy, which without an
arbiter changes nothing across jobs), ``spec`` with arbiter jobs as the
product's arbiter + adaptive policy.

One parameter is fitted, on the plain-Horovod variant only: the compute time
scale (the profile is measured one process alone; on the testbed two ranks of
a job share a core with their communication threads). Every horovod_prio
variant is then a prediction. Compared per job: the median step time while
all jobs ran (and, for a job joining later, the first job's steps before
it joined). Written to ``DIR/sim_check.md`` / ``.json``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from horovod_prio.method.config import PriorityConfig
from horovod_prio.sim.engine import JobSpec, LinkConfig, simulate
from horovod_prio.sim.profiles import Profile, load_profile

from . import cluster, netns

_MODE = {"hvd": "fifo", "prio": "priority", "spec": None}


def _scaled(profile: Profile, k: float) -> Profile:
    return replace(profile, layers=tuple(replace(l, forward_s=l.forward_s * k,
                                                 backward_s=l.backward_s * k)
                                         for l in profile.layers))


def _measured(results: dict) -> dict:
    """variant -> per job medians (while shared, and alone), medians over repeats."""
    out = {}
    for v in results["meta"].get("variants") or []:
        stats = [cluster.run_stats(r) for r in results["runs"]
                 if r.get("variant") == v and r.get("status") == "ok"]
        if not stats:
            continue
        n = len(stats[0]["jobs"])
        out[v] = [{"shared": _med([s["jobs"][i]["median_shared"] for s in stats]),
                   "alone": _med([s["jobs"][i]["median_alone"] for s in stats])}
                  for i in range(n)]
    return out


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _sim_jobs(results: dict, variant: str, profile: Profile):
    meta = results["meta"]
    jobs, mode = [], _MODE.get(variant) or "fifo"
    for i, d in enumerate(meta["jobs"]):
        impl = "horovod" if variant == "hvd" else d["impl"]
        if variant == "spec" and impl == "arb":
            mode = "adaptive"
        elif variant == "spec" and impl == "prio" and mode == "fifo":
            mode = "priority"
        cls = d.get("class") if variant == "spec" else None
        jobs.append(JobSpec(profile, 2, int(d["steps"]) + int(meta["warmup"]),
                            start=float(d.get("start") or 0.0) + 0.0005 * i, name="job%d" % i,
                            seed=i, job_class=int(cls or 0)))
    return jobs, mode


def _sim_stats(r, jobs, warmup):
    """Per job: median step while every job ran / outside that window (as run_stats)."""
    steps = [[(s.start, s.end) for s in r.steps[i][warmup:]] for i in range(len(jobs))]
    win = None
    if len(jobs) > 1 and all(steps):
        lo, hi = max(s[0][0] for s in steps), min(s[-1][1] for s in steps)
        win = (lo, hi) if hi > lo else None
    out = []
    for st in steps:
        if win:
            sh = [e - s for s, e in st if s >= win[0] - 1e-9 and e <= win[1] + 1e-9]
            al = [e - s for s, e in st if e <= win[0] + 1e-9 or s >= win[1] - 1e-9]
        else:
            sh, al = [e - s for s, e in st], []
        out.append({"shared": _med(sh), "alone": _med(al)})
    return out


def check(results: dict, profile: Profile, pcfg: PriorityConfig | None = None) -> dict:
    meta = results["meta"]
    link = LinkConfig(bandwidth=netns.parse_rate(meta["rate"]) / 8, topology="nic",
                      arbiter_credit=int(meta.get("arbiter_credit") or 8 << 20),
                      arbiter_order=meta.get("arbiter_order") or "burst",
                      starvation_bound=int(meta.get("starvation_bound", 8)))
    pcfg = pcfg or PriorityConfig.from_env({}, **_job_env(meta))
    measured = _measured(results)
    warmup = int(meta["warmup"])

    def run(variant, k):
        jobs, mode = _sim_jobs(results, variant, _scaled(profile, k))
        r = simulate(jobs, mode, link, pcfg)
        return _sim_stats(r, jobs, warmup)

    # fit the compute scale on plain Horovod (bisection: step time grows with k)
    target = measured["hvd"]

    def err(k):
        got = run("hvd", k)
        key = "shared" if got[0]["shared"] is not None else "alone"
        return statistics.fmean(g[key] for g in got) - statistics.fmean(
            t[key] for t in target if t[key] is not None)

    lo, hi = 0.05, 20.0
    for _ in range(40):
        mid = (lo * hi) ** 0.5
        if err(mid) > 0:
            hi = mid
        else:
            lo = mid
    k = (lo * hi) ** 0.5
    rows = []
    for v, meas in measured.items():
        sim = run(v, k)
        for i, (m, s) in enumerate(zip(meas, sim)):
            for key in ("shared", "alone"):
                if m[key] is None or s[key] is None:
                    continue
                rows.append({"variant": v, "job": i, "window": key, "measured_s": m[key],
                             "sim_s": s[key], "error": s[key] / m[key] - 1.0,
                             "fitted": v == "hvd"})
    return {"compute_scale": k, "rows": rows, "command": meta.get("command"),
            "git": meta.get("git"), "date": meta.get("date")}


def _job_env(meta) -> dict:
    """PriorityConfig fields the testbed jobs set through HOROVOD_PRIO_* env."""
    fields = {}
    for d in meta["jobs"]:
        for k, v in (d.get("env") or {}).items():
            name = k[len("HOROVOD_PRIO_"):].lower()
            if name in PriorityConfig.field_names() and name not in ("arbiter", "link"):
                fields[name] = v
    return fields


def markdown(res: dict) -> str:
    lines = ["Testbed: `%s` (git %s, %s); simulator compute scale fitted on plain Horovod: "
             "%.2f" % (res["command"], res["git"], res["date"], res["compute_scale"]), "",
             "| variant | job | window | testbed s/step | simulator s/step | error |",
             "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append("| %s%s | %d | %s | %.3f | %.3f | %+.1f%% |" % (
            r["variant"], " (fitted)" if r["fitted"] else "", r["job"], r["window"],
            r["measured_s"], r["sim_s"], 100 * r["error"]))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sim_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="a benchmarks.cluster output folder (results.json)")
    p.add_argument("--profile", required=True,
                   help="profile JSON of the model at the run's batch (benchmarks.profile_model)")
    a = p.parse_args(argv)
    d = Path(a.dir)
    results = json.loads((d / "results.json").read_text())
    res = check(results, load_profile(a.profile))
    md = markdown(res)
    (d / "sim_check.md").write_text(md)
    (d / "sim_check.json").write_text(json.dumps(res, indent=1))
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
