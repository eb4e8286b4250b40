"""The cross-job scenarios, simulated (the same ones the cluster testbed runs).

    python -m horovod_prio.sim.scenarios --model resnet50 --jobs 8 --workers 64 \\
        --bandwidth 25gbit --out results/sim/scenarios-resnet50-8x64-25g

* ``identical``: K identical jobs started together, plain Horovod (FIFO) vs
  horovod_prio + arbiter; the link floor (every job's bytes through the
  link), the headroom captured ``(hvd - prio) / (hvd - floor)`` and the worst
  job's slowdown.
* ``classes``: one class-1 job beside K-1 class-0 jobs, all behind the
  arbiter: the class-1 job's step time against its time alone, the class-0
  jobs' rate and the link utilisation; plain Horovod beside it.
* ``join``: job A runs alone, the other jobs join after ``join_after`` of A's
  steps and leave later; with the adaptive policy (the patent's scenario):
  A's boost, A's recovery (steps until it is within 10 % of its alone time),
  the others' slowdown, each job's link share over time; plain Horovod's
  timeline beside it.

Everything runs the product's code (see :mod:`horovod_prio.sim`); results are
plain dicts (JSON-ready) and, with ``out``, a markdown table and PNG plots.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import statistics
import subprocess
import sys
from dataclasses import replace
from typing import Dict, List, Optional

from ..method import units
from ..method.config import PriorityConfig
from .engine import JobSpec, LinkConfig, SimResult, comm_floor, simulate, window_steps
from .profiles import BUILTIN, get_profile

__all__ = ["identical", "classes", "join", "main"]


def _mean(xs):
    return statistics.fmean(xs) if xs else float("nan")


def _window_mean(r: SimResult, job: int, skip: int = 3) -> float:
    return _mean(window_steps(r, job, skip=skip) or r.step_times(job)[skip:] or r.step_times(job))


def _captured(hvd: float, prio: float, floor: float) -> Optional[float]:
    """(hvd - prio) / (hvd - floor); None when plain Horovod is within 1 % of the
    floor (no headroom to capture: the ratio would be noise over a tiny gap)."""
    return (hvd - prio) / (hvd - floor) if hvd > 1.01 * floor else None


def identical(profile, workers: int, link: LinkConfig, pcfg: PriorityConfig, jobs: int = 2,
              steps: int = 40) -> Dict:
    """K identical jobs: FIFO vs arbiter; floor, headroom captured, worst job.

    The jobs start together (0.5 ms apart), which the model keeps in lock-step:
    every job computes, then all communicate at once. Jobs on a real shared link
    drift apart (on the testbed, over 60 plain-Horovod repeats of two identical
    jobs, job 1 sat a median 0.37 of a step away from lock-step: docs/sim.md), so
    plain Horovod is also run *staggered*, job k released k/K of a step alone
    after job 0, and the arbiter is compared with both."""
    specs = [JobSpec(profile, workers, steps, start=0.0005 * k, name="job%d" % k, seed=k)
             for k in range(jobs)]
    alone = _window_mean(simulate(specs[:1], "fifo", link), 0)
    hvd = simulate(specs, "fifo", link)
    stag = simulate([replace(s, start=alone * k / jobs) for k, s in enumerate(specs)],
                    "fifo", link)
    hs = [_window_mean(stag, j) for j in range(jobs)]
    prio = simulate(specs, "arbiter", link, pcfg)
    h = [_window_mean(hvd, j) for j in range(jobs)]
    p = [_window_mean(prio, j) for j in range(jobs)]
    floor = jobs * comm_floor(profile, workers, link)
    hm, pm = _mean(h), _mean(p)
    return {
        "scenario": "identical", "jobs": jobs, "alone_s": alone, "floor_s": floor,
        "hvd_s": h, "prio_s": p, "hvd_mean_s": hm, "prio_mean_s": pm,
        "speedup": hm / pm, "headroom_captured": _captured(hm, pm, floor),
        "worst_job_vs_hvd": max(b / a for a, b in zip(h, p)) - 1.0,
        "link_busy": {"hvd": hvd.link_busy_s / hvd.makespan, "prio": prio.link_busy_s / prio.makespan,
                      "hvd_staggered": stag.link_busy_s / stag.makespan},
        "hvd_staggered_s": hs, "hvd_staggered_mean_s": _mean(hs),
        "speedup_vs_staggered": _mean(hs) / pm,
        "headroom_captured_vs_staggered": _captured(_mean(hs), pm, floor),
        "worst_job_vs_staggered": max(b / a for a, b in zip(hs, p)) - 1.0,
    }


def classes(profile, workers: int, link: LinkConfig, pcfg: PriorityConfig, jobs: int = 2,
            steps: int = 40) -> Dict:
    """One class-1 job beside class-0 jobs behind the arbiter."""
    specs = [JobSpec(profile, workers, steps, start=0.0005 * k, name="job%d" % k, seed=k,
                     job_class=1 if k == 0 else 0) for k in range(jobs)]
    alone = _window_mean(simulate(specs[:1], "arbiter", link, pcfg), 0)
    together = simulate(specs, "arbiter", link, pcfg)
    hvd = simulate([replace(s, job_class=0) for s in specs], "fifo", link)
    alone_hvd = _window_mean(simulate(specs[:1], "fifo", link), 0)
    stag = simulate([replace(s, job_class=0, start=alone_hvd * k / jobs)
                     for k, s in enumerate(specs)], "fifo", link)
    w = together.steps
    low_rate = [len(window_steps(together, j, skip=0)) /
                max(1e-12, sum(window_steps(together, j, skip=0))) for j in range(1, jobs)]
    return {
        "scenario": "classes", "jobs": jobs, "high_alone_s": alone,
        "high_with_others_s": _window_mean(together, 0),
        "high_ratio": _window_mean(together, 0) / alone,
        "hvd_ratio": _window_mean(hvd, 0) / alone,
        "hvd_staggered_ratio": _window_mean(stag, 0) / alone,
        "low_steps_per_s": low_rate, "low_steps_done": [len(w[j]) for j in range(1, jobs)],
        "link_busy": together.link_busy_s / together.makespan,
    }


def recovery_steps(steps, t0, alone, tol=0.10):
    """A's recovery in the patent's scenario: of its ``(start, seconds)`` steps,
    how many starting at or after ``t0`` (the join) until one is within ``tol``
    of ``alone`` (counting that one); None: never. The testbed's report
    (:mod:`benchmarks.cluster`) counts it the same way."""
    after = [sec for start, sec in steps if start >= t0]
    for i, sec in enumerate(after):
        if sec <= alone * (1 + tol):
            return i + 1
    return None


def join(profile, workers: int, link: LinkConfig, pcfg: PriorityConfig, jobs: int = 2,
         join_after: int = 20, together_steps: int = 40, total_steps: int = 120) -> Dict:
    """Job A alone, the others join after ``join_after`` of A's steps (the patent's scenario)."""
    alone_r = simulate([JobSpec(profile, workers, 5)], "fifo", link)
    alone = alone_r.step_times(0)[-1]
    t_join = join_after * alone
    specs = [JobSpec(profile, workers, total_steps, name="A")] + [
        JobSpec(profile, workers, together_steps, start=t_join + 0.0005 * k, name="B%d" % k,
                seed=k) for k in range(1, jobs)]
    out = {"scenario": "join", "jobs": jobs, "alone_s": alone, "t_join_s": t_join}
    for mode in ("fifo", "adaptive"):
        r = simulate(specs, mode, link, pcfg)
        a = r.steps[0]
        others_end = max(s[-1].end for s in r.steps[1:])
        during = [x for x in a if x.start >= t_join and x.end <= others_end]
        b_mean = _mean([_mean([x.seconds for x in s[3:]]) for s in r.steps[1:]])
        out[mode] = {
            "a_steps": [(x.start, x.seconds, x.boost, x.outcome) for x in a],
            "others_steps": [[(x.start, x.seconds) for x in s] for s in r.steps[1:]],
            "served": r.link_served,
            "a_recovery_steps": recovery_steps([(x.start, x.seconds) for x in a], t_join, alone),
            "a_mean_while_shared_s": _mean([x.seconds for x in during]),
            "others_mean_s": b_mean,
            "others_slowdown_vs_alone": b_mean / alone - 1.0,
            "a_max_boost": max(x.boost for x in a),
            "decays_after_others_left": sum(1 for x in a if x.decayed and x.start >= others_end),
        }
    return out


def _plot_join(res: Dict, path: str) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(3, 2, figsize=(12, 8), sharex="col")
    for col, mode in enumerate(("fifo", "adaptive")):
        r = res[mode]
        ax = axes[0][col]
        ax.plot([s[0] for s in r["a_steps"]], [s[1] for s in r["a_steps"]], label="job A")
        for k, o in enumerate(r["others_steps"]):
            ax.plot([s[0] for s in o], [s[1] for s in o], label="job B%d" % (k + 1))
        ax.axhline(res["alone_s"], color="grey", ls=":", label="A alone")
        ax.set_title({"fifo": "plain Horovod", "adaptive": "horovod_prio + arbiter (adaptive)"}[mode])
        ax.set_ylabel("step time (s)")
        ax.legend(fontsize=7)
        axes[1][col].step([s[0] for s in r["a_steps"]], [s[2] for s in r["a_steps"]], where="post")
        axes[1][col].set_ylabel("A's boost")
        ax = axes[2][col]
        for k, served in enumerate(r["served"]):
            ts = [t for t, _ in served][1:]
            rates = [(b1 - b0) / max(1e-12, t1 - t0)
                     for (t0, b0), (t1, b1) in zip(served, served[1:])]
            ax.plot(ts, rates, label="A" if k == 0 else "B%d" % k)
        ax.set_ylabel("link bytes/s (per step)")
        ax.set_xlabel("time (s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _table(results: List[Dict]) -> str:
    lines = []
    for r in results:
        if r["scenario"] == "identical":
            def pct(x):
                return "-" if x is None else "%.0f%%" % (100 * x)
            lines += ["| identical, %d jobs | hvd %.4f s in lock-step, %s staggered | prio+arbiter "
                      "%.4f s | floor %.4f s | speedup %.2fx (%s vs staggered) | headroom "
                      "captured %s (%s) | worst job %+.1f%% (%s) |" % (
                          r["jobs"], r["hvd_mean_s"], "%.4f s" % r["hvd_staggered_mean_s"],
                          r["prio_mean_s"], r["floor_s"], r["speedup"],
                          "%.2fx" % r["speedup_vs_staggered"], pct(r["headroom_captured"]),
                          pct(r["headroom_captured_vs_staggered"]),
                          100 * r["worst_job_vs_hvd"],
                          "%+.1f%%" % (100 * r["worst_job_vs_staggered"]))]
        elif r["scenario"] == "classes":
            lines += ["| class 1 beside %d class-0 | alone %.4f s | with them %.4f s (%.2fx; plain "
                      "Horovod %.2fx in lock-step, %s staggered) | class-0 steps/s %s | link busy "
                      "%.0f%% |" % (
                          r["jobs"] - 1, r["high_alone_s"], r["high_with_others_s"], r["high_ratio"],
                          r["hvd_ratio"], "%.2fx" % r["hvd_staggered_ratio"],
                          ", ".join("%.2f" % x for x in r["low_steps_per_s"]),
                          100 * r["link_busy"])]
        else:
            for mode in ("fifo", "adaptive"):
                m = r[mode]
                lines += ["| join (%s) | A alone %.4f s | A while shared %.4f s | A recovers in %s "
                          "steps | others +%.0f%% vs alone | max boost %d |" % (
                              mode, r["alone_s"], m["a_mean_while_shared_s"],
                              m["a_recovery_steps"], 100 * m["others_slowdown_vs_alone"],
                              m["a_max_boost"])]
    return "\n".join(lines) + "\n"


def _git_rev():
    """The checkout's short commit when run from a git work tree, else None."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, cwd=os.path.dirname(os.path.abspath(__file__)))
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


SCENARIOS = {"identical": identical, "classes": classes, "join": join}


def _scenario_list(text):
    names = [n.strip() for n in text.split(",")]
    bad = [n for n in names if n not in SCENARIOS]
    if bad:
        raise argparse.ArgumentTypeError(
            "expected scenarios among %s, got %r" % (", ".join(SCENARIOS), text))
    return names


def main(argv=None) -> int:
    duration = units.arg(units.parse_duration_s)
    p = argparse.ArgumentParser(prog="python -m horovod_prio.sim.scenarios",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50",
                   help="builtin (%s) or a profile JSON path" % ", ".join(sorted(BUILTIN)))
    p.add_argument("--jobs", type=units.arg(units.parse_int, 2), default=2)
    p.add_argument("--workers", type=units.arg(units.parse_int, 2), default=8)
    p.add_argument("--bandwidth", type=units.arg(units.parse_rate_bytes_per_s), default="25gbit",
                   help="e.g. 1gbit, 25gbit")
    p.add_argument("--topology", choices=("nic", "bus"), default="nic")
    p.add_argument("--scenarios", type=_scenario_list, default="identical,classes,join",
                   help="comma-separated: %s" % ",".join(SCENARIOS))
    p.add_argument("--steps", type=units.arg(units.parse_int, 10), default=40)
    p.add_argument("--collective-overhead", type=duration, default=0.0, metavar="T",
                   help="per-collective cost before it occupies the link (e.g. 6ms; default 0)")
    p.add_argument("--arbiter-rtt", type=duration, default=0.0, metavar="T",
                   help="job <-> arbiter round trip per grant (default 0)")
    p.add_argument("--arbiter-credit", type=units.arg(units.parse_bytes, 1),
                   default=LinkConfig.arbiter_credit, metavar="N",
                   help="granted-but-unfinished bytes on the link (the arbiter's "
                        "--credit-bytes; default 8MiB, its default)")
    p.add_argument("--arbiter-class-reserve", type=units.arg(units.parse_class_reserve),
                   default=LinkConfig.arbiter_class_reserve,
                   metavar="F", help="share of the credit kept free for the highest connected "
                   "class (the arbiter's --class-reserve; default 0 = off, its default)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    link = LinkConfig(bandwidth=a.bandwidth, topology=a.topology,
                      collective_overhead=a.collective_overhead, arbiter_rtt=a.arbiter_rtt,
                      arbiter_credit=a.arbiter_credit,
                      arbiter_class_reserve=a.arbiter_class_reserve)
    prof = get_profile(a.model)
    pcfg = PriorityConfig.from_env({}, relative_coefficient=0.1, count_threshold=10,
                                   warmup_batches=2)
    results = []
    for name in a.scenarios:     # names checked and stripped by _scenario_list
        kw = {"steps": a.steps} if name != "join" else {}
        results.append(SCENARIOS[name](prof, a.workers, link, pcfg, jobs=a.jobs, **kw))
    table = _table(results)
    print(table)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        args = sys.argv[1:] if argv is None else list(argv)
        meta = {"argv": args,
                "command": "python -m horovod_prio.sim.scenarios " + " ".join(
                    shlex.quote(x) for x in args),
                "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "git": _git_rev()}
        with open(os.path.join(a.out, "scenarios.json"), "w") as f:
            json.dump(dict(meta, results=results), f, indent=1)
        with open(os.path.join(a.out, "scenarios.md"), "w") as f:
            f.write(table)
        for r in results:
            if r["scenario"] == "join":
                _plot_join(r, os.path.join(a.out, "join.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
