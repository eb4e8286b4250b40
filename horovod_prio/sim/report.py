"""Tables (markdown + JSON) and plots of simulation results."""
from __future__ import annotations

import json
import os
import statistics
from typing import Dict, List, Optional, Sequence

from .engine import SimResult, comm_floor, overlap_window, window_steps


def _q(xs: Sequence[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[i]


def summarize(result: SimResult, link, alone: Optional[Dict[int, float]] = None,
              skip: int = 1) -> List[Dict]:
    """One row per job: step-time statistics inside the overlap window (every
    job running), slowdown vs the job alone (``alone[job]`` = its mean step
    time alone under plain Horovod), policy raises/decays."""
    rows = []
    win = overlap_window(result)
    for j, spec in enumerate(result.jobs):
        xs = window_steps(result, j, skip=skip) or result.step_times(j)
        recs = result.steps[j]
        mean = statistics.fmean(xs) if xs else float("nan")
        row = {
            "mode": result.mode, "job": j, "model": spec.profile.name,
            "workers": spec.workers, "steps": len(recs),
            "window_steps": len(xs),
            "mean_step_s": mean, "p50_step_s": _q(xs, 0.5), "p95_step_s": _q(xs, 0.95),
            "compute_s": spec.profile.compute_s,
            "comm_floor_s": comm_floor(spec.profile, spec.workers, link),
            "raises": sum(1 for r in recs if r.outcome == "slow"),
            "decays": sum(1 for r in recs if r.decayed),
            "max_boost": max((r.boost for r in recs), default=0),
        }
        if alone and j in alone:
            row["alone_step_s"] = alone[j]
            row["vs_alone"] = mean / alone[j] if alone[j] > 0 else float("nan")
        rows.append(row)
    for row in rows:
        row["link_busy"] = result.link_busy_s / result.makespan if result.makespan else 0.0
        row["window"] = list(win) if win else None
    return rows


def mode_means(rows: List[Dict]) -> Dict[str, float]:
    """Mean over jobs of each mode's mean step time."""
    out: Dict[str, List[float]] = {}
    for r in rows:
        out.setdefault(r["mode"], []).append(r["mean_step_s"])
    return {m: statistics.fmean(v) for m, v in out.items()}


def markdown_table(rows: List[Dict], max_jobs: int = 8) -> str:
    """Per-mode summary (mean over jobs) plus per-job rows for up to
    ``max_jobs`` jobs."""
    base = mode_means(rows)
    fifo = base.get("fifo")
    lines = ["| mode | job | model | mean step (s) | p95 (s) | vs alone | vs fifo | comm floor (s)"
             " | link busy | raises / decays |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    fifo_job = {r["job"]: r["mean_step_s"] for r in rows if r["mode"] == "fifo"}
    for r in rows:
        if r["job"] >= max_jobs:
            continue
        va = f"{r['vs_alone']:.2f}x" if "vs_alone" in r else "-"
        vf = f"{r['mean_step_s'] / fifo_job[r['job']]:.3f}" if fifo_job.get(r["job"]) else "-"
        lines.append(
            f"| {r['mode']} | {r['job']} | {r['model']} | {r['mean_step_s']:.4f} | "
            f"{r['p95_step_s']:.4f} | {va} | {vf} | {r['comm_floor_s']:.4f} | "
            f"{r['link_busy'] * 100:.0f}% | {r['raises']} / {r['decays']} |")
    for m, v in base.items():
        vf = f"{v / fifo:.3f}" if fifo else "-"
        lines.append(f"| **{m}** | all | | **{v:.4f}** | | | {vf} | | | |")
    return "\n".join(lines)


def write_outputs(out_dir: str, rows: List[Dict], results: Dict[str, SimResult],
                  meta: Dict, plot: bool = True, title: str = "") -> List[str]:
    """``results.json``, ``results.md``, ``steps.csv`` and (if matplotlib is
    importable) ``steps.png``; returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    # per-step records are in steps.csv; here only the boost-changing events
    def changes(events):
        out, prev = [], 0
        for e in events:
            if e["boost"] != prev:
                out.append(e)
            prev = e["boost"]
        return out
    js = {"meta": meta, "rows": rows, "mode_mean_step_s": mode_means(rows),
          "boost_changes": {m: [changes(job) for job in r.policy_events]
                            for m, r in results.items() if any(r.policy_events)}}
    p = os.path.join(out_dir, "results.json")
    with open(p, "w") as f:
        json.dump(js, f, indent=1, default=float)
    paths.append(p)
    p = os.path.join(out_dir, "results.md")
    with open(p, "w") as f:
        f.write(f"# {title or 'horovod-prio sim'}\n\n")
        f.write("Command: `" + meta.get("command", "") + "`\n\n")
        f.write(markdown_table(rows) + "\n")
    paths.append(p)
    p = os.path.join(out_dir, "steps.csv")
    with open(p, "w") as f:
        f.write("mode,job,step,start_s,end_s,seconds,boost,outcome,decayed\n")
        for m, r in results.items():
            for job in r.steps:
                for s in job:
                    f.write(f"{m},{s.job},{s.step},{s.start:.6f},{s.end:.6f},{s.seconds:.6f},"
                            f"{s.boost},{s.outcome},{int(s.decayed)}\n")
    paths.append(p)
    if plot:
        png = plot_steps(results, os.path.join(out_dir, "steps.png"), title=title)
        if png:
            paths.append(png)
    return paths


def plot_steps(results: Dict[str, SimResult], path: str, title: str = "",
               max_jobs: int = 8) -> Optional[str]:
    """Step time over time per job, one panel per mode; boost raises (^) and
    decays (v) of the adaptive policy marked. ``None`` if matplotlib is
    missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    modes = list(results)
    fig, axes = plt.subplots(len(modes), 1, figsize=(9, 2.4 * len(modes) + 0.6),
                             sharex=True, squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, m in zip(axes[:, 0], modes):
        r = results[m]
        for j, job in enumerate(r.steps[:max_jobs]):
            c = colors[j % len(colors)]
            xs = [s.end for s in job]
            ys = [s.seconds for s in job]
            ax.plot(xs, ys, "-", color=c, lw=1, label=f"job {j} ({r.jobs[j].profile.name})")
            up = [(s.end, s.seconds) for s in job if s.outcome == "slow"]
            dn = [(s.end, s.seconds) for s in job if s.decayed]
            if up:
                ax.plot(*zip(*up), "^", color=c, ms=4, alpha=0.7)
            if dn:
                ax.plot(*zip(*dn), "v", color=c, ms=5, mfc="none")
        ax.set_ylabel(f"{m}\nstep (s)")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="upper right", ncol=2)
    axes[-1, 0].set_xlabel("simulated time (s)   [^ boost raised (slow), v decay]")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path
