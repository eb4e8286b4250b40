"""The sweep behind docs/sim.md: where does priority help, where not?

    python -m horovod_prio.sim.sweep --out results/sim/sweep

Two identical jobs x 8 workers on one link, each model at three link rates
(compute/comm ratio around 1), started together ("sync") or 40 % of a step
apart ("offset"), 300 steps, 2 % compute jitter; every scheduler
configuration below. Plus a "job joins" table (job 0 alone, then job 1
joins for a while: the adaptive policy's raise/decay case) and a single-job
table (the cost of group fusion).
Metric: mean step time of the two jobs inside the window where both run,
as a ratio to Horovod FIFO in the same scenario (< 1 = faster).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from ..method.config import PriorityConfig
from .engine import JobSpec, LinkConfig, comm_floor, simulate, window_steps
from .profiles import get_profile

MODELS = (("resnet50", (5, 10, 25)), ("vgg16", (10, 25, 50)), ("bert-base", (10, 25, 50)))
#: (job 0 model, job 1 model, Gbit/s) of the mixed "a job joins" runs
MIXED = (("resnet50", "vgg16", 25), ("resnet50", "bert-base", 25), ("bert-base", "vgg16", 25))
#: label -> (mode, LinkConfig overrides, PriorityConfig overrides)
CONFIGS = (
    ("fifo", "fifo", {}, {}),
    ("priority", "priority", {}, {}),
    ("arbiter K=8", "arbiter", {}, {}),
    ("arbiter K=8, chunk order", "arbiter", {"arbiter_order": "chunk"}, {}),
    ("adaptive K=8", "adaptive", {}, {}),
    ("arbiter no-K", "arbiter", {"starvation_bound": 0}, {}),
    ("adaptive no-K", "adaptive", {"starvation_bound": 0}, {}),
    ("adaptive no-K, all groups", "adaptive", {"starvation_bound": 0},
     {"adjust_groups": 4, "step": 4}),
)


def _wmean(r, job, window=None, skip=5) -> float:
    xs = window_steps(r, job, window, skip=skip) or r.step_times(job)
    return statistics.fmean(xs)


def run(steps: int = 300, jitter: float = 0.02, workers: int = 8):
    rows = []
    for model, rates in MODELS:
        prof = get_profile(model)
        for gbit in rates:
            base = LinkConfig(bandwidth=gbit * 1e9 / 8)
            alone = statistics.fmean(simulate([JobSpec(prof, workers, 30)], "fifo",
                                              base).step_times(0)[1:])
            for start_label, offset in (("sync", 0.0), ("offset", 0.4 * alone)):
                jobs = [JobSpec(prof, workers, steps, 0.0, jitter=jitter, seed=1),
                        JobSpec(prof, workers, steps, offset, jitter=jitter, seed=1)]
                res = {}
                for label, mode, lk, pk in CONFIGS:
                    link = LinkConfig(**dict(vars(base), **lk))
                    r = simulate(jobs, mode, link, PriorityConfig.from_env({}, **pk))
                    per_job = [_wmean(r, j) for j in range(2)]
                    res[label] = {"mean_s": statistics.fmean(per_job), "jobs_s": per_job,
                                  "link_busy": r.link_busy_s / r.makespan,
                                  "raises": sum(1 for j in r.steps for s in j
                                                if s.outcome == "slow"),
                                  "decays": sum(1 for j in r.steps for s in j if s.decayed)}
                f = res["fifo"]
                for label, d in res.items():
                    d["vs_fifo"] = d["mean_s"] / f["mean_s"]
                    d["worst_job_vs_fifo"] = max(a / b for a, b in zip(d["jobs_s"], f["jobs_s"]))
                rows.append({"model": model, "gbit": gbit, "start": start_label,
                             "compute_s": prof.compute_s,
                             "comm_s": comm_floor(prof, workers, base), "alone_s": alone,
                             "results": res})
    join = []
    pairs = [(m, m, rates[1]) for m, rates in MODELS] + list(MIXED)
    for m0, m1, gbit in pairs:
        p0, p1 = get_profile(m0), get_profile(m1)
        base = LinkConfig(bandwidth=gbit * 1e9 / 8)
        alone = statistics.fmean(simulate([JobSpec(p0, workers, 30)], "fifo",
                                          base).step_times(0)[1:])
        jobs = [JobSpec(p0, workers, steps, 0.0, jitter=jitter, seed=1),
                JobSpec(p1, workers, steps // 3, 20.4 * alone, jitter=jitter, seed=1)]
        out = {"model": m0 if m0 == m1 else f"{m0} + {m1}", "gbit": gbit, "alone_s": alone,
               "results": {}}
        for label, mode, lk, pk in CONFIGS:
            link = LinkConfig(**dict(vars(base), **lk))
            r = simulate(jobs, mode, link, PriorityConfig.from_env({}, **pk))
            w = (r.steps[1][0].start, r.steps[1][-1].end)
            a = _wmean(r, 0, w, skip=0)
            b = _wmean(r, 1, w, skip=3)
            out["results"][label] = {
                "a_s": a, "b_s": b,
                "raises": [sum(1 for s in j if s.outcome == "slow") for j in r.steps],
                "decays": [sum(1 for s in j if s.decayed) for j in r.steps],
                "max_boost": [max((s.boost for s in j), default=0) for j in r.steps]}
        join.append(out)
    single = []
    for model, rates in MODELS:
        prof = get_profile(model)
        link = LinkConfig(bandwidth=rates[1] * 1e9 / 8)
        out = {"model": model, "gbit": rates[1]}
        for label, mode, pk in (("fifo", "fifo", {}), ("priority, 4 groups", "priority", {}),
                                ("priority, 1 group/layer", "priority",
                                 {"num_groups": prof.num_tasks})):
            r = simulate([JobSpec(prof, workers, 30)], mode, link,
                         PriorityConfig.from_env({}, **pk))
            out[label] = statistics.fmean(r.step_times(0)[1:])
        single.append(out)
    return rows, single, join


def markdown(rows, single, join=()) -> str:
    labels = [c[0] for c in CONFIGS[1:]]
    lines = ["Two jobs sharing the link: mean step time of both jobs, ratio to Horovod FIFO "
             "(< 1 is faster; in brackets: the worse job's ratio).", "",
             "| model | Gbit/s | compute / comm (s) | start | FIFO s/step | "
             + " | ".join(labels) + " |",
             "|---|---|---|---|---|" + "---|" * len(labels)]
    for r in rows:
        res = r["results"]
        cells = [f"{res[l]['vs_fifo']:.3f} ({res[l]['worst_job_vs_fifo']:.2f})" for l in labels]
        lines.append(f"| {r['model']} | {r['gbit']} | {r['compute_s']:.3f} / {r['comm_s']:.3f} "
                     f"| {r['start']} | {res['fifo']['mean_s']:.3f} | " + " | ".join(cells) + " |")
    if join:
        lines += ["", "A job joins: job 0 runs alone for 20 steps, job 1 (same or another "
                  "model) joins for a third of the run, then leaves. s/step of job 0 / job 1 while both run; "
                  "boost raises / effective decays of job 0 and job 1.", "",
                  "| model | Gbit/s | config | job 0 s/step | job 1 s/step | mean | raises | "
                  "decays | max boost |", "|---|---|---|---|---|---|---|---|---|"]
        for j in join:
            for label, d in j["results"].items():
                lines.append(f"| {j['model']} | {j['gbit']} | {label} | {d['a_s']:.3f} | "
                             f"{d['b_s']:.3f} | {(d['a_s'] + d['b_s']) / 2:.3f} | "
                             f"{d['raises'][0]} / {d['raises'][1]} | "
                             f"{d['decays'][0]} / {d['decays'][1]} | "
                             f"{d['max_boost'][0]} / {d['max_boost'][1]} |")
    lines += ["", "One job alone (s/step):", "",
              "| model | Gbit/s | FIFO | priority, 4 groups | priority, 1 group/layer |",
              "|---|---|---|---|---|"]
    for s in single:
        lines.append(f"| {s['model']} | {s['gbit']} | {s['fifo']:.3f} | "
                     f"{s['priority, 4 groups']:.3f} | {s['priority, 1 group/layer']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m horovod_prio.sim.sweep")
    p.add_argument("--out", default=None)
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args(argv)
    if a.steps < 10:
        p.error("argument --steps: must be >= 10")
    t = time.perf_counter()
    rows, single, join = run(a.steps)
    md = markdown(rows, single, join)
    print(md)
    print(f"(simulated in {time.perf_counter() - t:.1f} s)", file=sys.stderr)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "sweep.json"), "w") as f:
            json.dump({"rows": rows, "single": single, "join": join}, f, indent=1)
        with open(os.path.join(a.out, "sweep.md"), "w") as f:
            f.write("# Simulator sweep\n\nCommand: `python -m horovod_prio.sim.sweep --out "
                    f"{a.out}`\n\n" + md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
