"""Statistics, markdown table and PNG plots from a benchmark results dict.

    python -m benchmarks.report results/bench/quick/results.json [--out DIR]

Per run: each job's step times are its measured steps (warmup excluded); when
several jobs ran, only steps that lie entirely inside the overlap window
(every job measuring) count, so "two jobs on the link" means exactly that.
Per config: medians over repeats; a ratio ("speedup") is computed within one
repeat against the baseline run of the same repeat (plain Horovod alone for
scenario a, Horovod+Horovod for b/c), then the median over repeats is taken.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from horovod_prio.method.units import parse_rate_bits_per_s

SHORT = {"horovod": "hvd", "prio": "prio"}


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _cycles(steps: list[dict], clock: str) -> list[tuple[int, float | None, float | None]]:
    """(step, start, end) of each measured step on ``clock`` ("t": wall, "cpu":
    process CPU time), where a step ends when the next one starts (its cycle:
    also what runs between two batches -- callbacks, and with ``hvd.overlap`` a
    flush a callback asks for); the last step ends at its own end. None where a
    record lacks the clock."""
    steps = [s for s in steps if not s.get("warmup")]
    return [(s.get("step"), s.get(clock + "_start"),
             nxt.get(clock + "_start") if nxt is not None else s.get(clock + "_end"))
            for s, nxt in zip(steps, steps[1:] + [None])]


def measured_steps(job: dict) -> list[tuple[float, float]]:
    """(start, end) wall time of each measured step, over its cycle (:func:`_cycles`)."""
    return [(a, b) for _, a, b in _cycles(job.get("steps", []), "t")]


def _cpu_cycles(steps: list[dict]) -> dict:
    """step number -> CPU seconds over its cycle, for the measured steps that
    carry CPU times."""
    return {n: b - a for n, a, b in _cycles(steps, "cpu") if a is not None and b is not None}


def measured_cpu(job: dict) -> list[float | None]:
    """CPU seconds the whole job (every rank's process, all threads) spent in
    each step of :func:`measured_steps`, over the same cycle: rank 0's records
    plus ``job["rank_cpu"]`` (the other ranks'). None for a step some rank has
    no CPU time for (results recorded before 2026-12-04 have none)."""
    ranks = [_cpu_cycles(job.get("steps", []))]
    ranks += [_cpu_cycles(v) for _, v in sorted((job.get("rank_cpu") or {}).items())]
    size = (job.get("meta") or {}).get("size")
    complete = size is None or len(ranks) == size
    out = []
    for n, _, _ in _cycles(job.get("steps", []), "t"):
        parts = [r.get(n) for r in ranks]
        out.append(sum(parts) if complete and None not in parts else None)
    return out


def overlap_window(run: dict) -> tuple[float, float] | None:
    spans = [measured_steps(j) for j in run.get("jobs", [])]
    if not spans or any(not s for s in spans):
        return None
    return max(s[0][0] for s in spans), min(s[-1][1] for s in spans)


def _link_util(run: dict, lo: float, hi: float) -> float | None:
    samples = run.get("link_samples") or []
    if len(samples) < 2 or hi <= lo:
        return None

    def at(t):
        prev = samples[0]
        for s in samples:
            if s[0] >= t:
                if s[0] == prev[0]:
                    return s[1]
                f = (t - prev[0]) / (s[0] - prev[0])
                return prev[1] + f * (s[1] - prev[1])
            prev = s
        return samples[-1][1]

    lo, hi = max(lo, samples[0][0]), min(hi, samples[-1][0])
    if hi - lo < 0.5:
        return None
    return (at(hi) - at(lo)) * 8 / (parse_rate_bits_per_s(run["rate"]) * (hi - lo))


def run_stats(run: dict) -> dict:
    """Per-job step statistics over the overlap window, mean over jobs, link busy."""
    jobs = run.get("jobs", [])
    win = overlap_window(run) if len(jobs) > 1 else None
    out = {"jobs": [], "window": win}
    for j in jobs:
        steps = list(zip(measured_steps(j), measured_cpu(j)))
        used = [(s, c) for s, c in steps
                if win is None or (s[0] >= win[0] - 1e-6 and s[1] <= win[1] + 1e-6)]
        fallback = len(used) < 3
        if fallback:
            used = steps
        d = sorted(e - s for (s, e), _ in used)
        cpu = [c for _, c in used]
        out["jobs"].append({
            "name": j["name"], "impl": j["impl"], "n": len(d), "window_fallback": fallback,
            "median": median(d), "mean": statistics.fmean(d) if d else None,
            "p90": d[min(len(d) - 1, int(0.9 * len(d)))] if d else None,
            "cpu_median": median(cpu) if cpu and None not in cpu else None,
        })
    meds = [j["median"] for j in out["jobs"]]
    out["mean_of_jobs"] = statistics.fmean(meds) if meds and None not in meds else None
    if jobs:
        span = win
        if span is None and measured_steps(jobs[0]):
            span = (measured_steps(jobs[0])[0][0], measured_steps(jobs[0])[-1][1])
        out["link_busy"] = _link_util(run, *span) if span else None
        meta = jobs[0].get("meta", {})
        gb, size = meta.get("grad_bytes"), meta.get("size", 2)
        # ring allreduce on one shared lo: every rank sends 2(N-1)/N*S -> 2(N-1)*S per job
        out["floor"] = (2 * (size - 1) * gb * 8 * len(jobs) / parse_rate_bits_per_s(run["rate"])) if gb else None
    return out


def _baseline_config(run: dict) -> list[str]:
    return ["horovod"] * len(run["config"])


def summarize(results: dict) -> list[dict]:
    runs = [r for r in results.get("runs", [])]
    for r in runs:
        if r.get("status") == "ok":
            r["_stats"] = run_stats(r)
    groups: dict = {}
    for r in runs:
        key = (r["scenario"], r["rate"], r["batch"], tuple(r["config"]))
        groups.setdefault(key, []).append(r)
    index = {(r["scenario"], r["rate"], r["batch"], tuple(r["config"]), r["repeat"]): r
             for r in runs if r.get("status") == "ok"}
    rows = []
    for key in groups:
        scen, rate, batch, cfg = key
        rs = groups[key]
        ok = [r for r in rs if r.get("status") == "ok"]
        row = {"scenario": scen, "rate": rate, "batch": batch, "config": list(cfg),
               "runs_ok": len(ok), "runs": len(rs),
               "status": "ok" if ok else (rs[0].get("status") or "?"),
               "note": None if ok else (rs[0].get("error") or "").splitlines()[0] if rs[0].get("error") else None}
        if ok:
            model = (ok[0]["jobs"][0].get("meta") or {}).get("model") or ok[0]["jobs"][0].get("model")
            row["model"] = model
            njobs = len(cfg)
            row["job_s"] = [median([r["_stats"]["jobs"][i]["median"] for r in ok]) for i in range(njobs)]
            row["mean_s"] = median([r["_stats"]["mean_of_jobs"] for r in ok])
            row["floor_s"] = median([r["_stats"].get("floor") for r in ok])
            row["link_busy"] = median([r["_stats"].get("link_busy") for r in ok])
            cpus = [[j.get("cpu_median") for j in r["_stats"]["jobs"]] for r in ok]
            row["cpu_s"] = median([statistics.fmean(c) for c in cpus if c and None not in c])
            sp, worst = [], []
            base_cfg = tuple(_baseline_config(ok[0]))
            for r in ok:
                b = index.get((scen, rate, batch, base_cfg, r["repeat"]))
                if not b:
                    continue
                bs = b["_stats"]
                if bs["mean_of_jobs"] and r["_stats"]["mean_of_jobs"]:
                    sp.append(bs["mean_of_jobs"] / r["_stats"]["mean_of_jobs"])
                worst.append(max(r["_stats"]["jobs"][i]["median"] / bs["jobs"][i]["median"] - 1
                                 for i in range(njobs)))
            row["speedup"] = median(sp)
            row["speedup_range"] = (min(sp), max(sp)) if len(sp) > 1 and cfg != base_cfg else None
            row["worst_job_change"] = median(worst)
        rows.append(row)
    return rows


def fmt(x, spec="{:.3f}"):
    return "–" if x is None else spec.format(x)


def notes_and_load(results, meta):
    """Markdown lines under a results table: per-run notes and the machine's load."""
    lines = []
    for r in results.get("runs", []):
        for n in r.get("notes") or []:
            lines += ["", f"Note ({r.get('label')}): {n}."]
    loads = [x for r in results.get("runs", []) for x in (r.get("loadavg_before"),
                                                           r.get("loadavg_after")) if x is not None]
    if loads:
        ncpu = meta.get("ncpu") or 2
        busy = max(loads) > 2.5 * ncpu + 1
        lines += ["", f"1-min load average at run start/end: median {statistics.median(loads):.1f}, "
                      f"max {max(loads):.1f} on {ncpu} cores (a two-job run itself accounts for "
                      f"about 4-5)"
                      + ("; **other load on the machine: compute-bound numbers are not reliable**"
                         if busy else "") + "."]
    return lines


def ratio_cell(value, rng=None):
    """``1.05×`` and, given the lowest and highest per-repeat ratio, their
    spread: ``1.05× (0.98–1.12)`` (on a noisy box one repeat's ratio says little)."""
    cell = fmt(value, "{:.2f}×")
    if rng is not None:
        cell += f" ({rng[0]:.2f}–{rng[1]:.2f})"
    return cell


def markdown(results: dict) -> str:
    rows = summarize(results)
    meta = results.get("meta", {})
    lines = [
        f"Command: `{meta.get('command', '?')}` — {meta.get('date', '')}, git {meta.get('git')}, "
        f"{meta.get('ncpu')} cores, pin={meta.get('pin')}, TF threads={meta.get('threads')}"
        f"{'' if not meta.get('inter_threads') else ' (inter-op ' + str(meta.get('inter_threads')) + ')'}, "
        f"{meta.get('steps')} measured steps/job after {meta.get('warmup')} warmup, "
        f"repeats={meta.get('repeats')}" + (f", delay={meta['delay']}" if meta.get("delay") else "")
        + "".join(f"; resumed with --resume {x.get('date')} at git {x.get('git')} "
                  f"({x.get('runs_kept')} runs kept)" for x in meta.get("resumed", [])),
        "",
        "| scen | link | model, batch/rank | jobs | job0 s/step | job1 s/step | mean s/step "
        "| comm floor s/step | speedup vs hvd | worst job vs hvd | link busy | job CPU s/step "
        "| runs ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["status"] == "skipped" and r.get("note") == "not in --impls":
            continue
        cfg = "+".join(SHORT.get(c, c) for c in r["config"])
        if r["status"] != "ok" or not r.get("runs_ok"):
            lines.append(f"| {r['scenario']} | {r['rate']} | {r.get('model') or meta.get('model', '')}, "
                         f"{r['batch']} | {cfg} | {r['status']}: {r.get('note') or ''} "
                         f"| | | | | | | | 0/{r['runs']} |")
            continue
        js = r["job_s"] + [None] * (2 - len(r["job_s"]))
        speedup = ratio_cell(r["speedup"], r.get("speedup_range"))
        lines.append(
            f"| {r['scenario']} | {r['rate']} | {r['model']}, {r['batch']} | {cfg} | {fmt(js[0])} "
            f"| {fmt(js[1])} | {fmt(r['mean_s'])} | {fmt(r['floor_s'])} | {speedup} "
            f"| {fmt(r['worst_job_change'], '{:+.1%}')} | {fmt(r['link_busy'], '{:.0%}')} "
            f"| {fmt(r.get('cpu_s'))} | {r['runs_ok']}/{r['runs']} |")
    lines += notes_and_load(results, meta)
    if not meta.get("prio_available", True) and "prio" in meta.get("impls", ["prio"]):
        lines += ["", f"horovod_prio binding unavailable in this run "
                      f"({meta.get('prio_unavailable_reason')}): prio configs skipped."]
    lines += ["", "s/step: median over repeats of each job's median step time (a step from its start to the next step's start; warmup excluded; "
              "with two jobs only steps while both were measuring). speedup: baseline mean "
              "s/step ÷ this config's, baseline = plain Horovod in the same repeat "
              "(alone for a, hvd+hvd for b/c), median over repeats (in brackets: the lowest and "
              "highest per-repeat ratio). worst job: largest "
              "per-job slowdown vs the baseline's same job. comm floor: bytes every rank "
              "sends through the shared lo (2(N−1)·S per job) ÷ rate. link busy: tc bytes "
              "sent ÷ (rate × time) over the same window. job CPU: CPU seconds all of a job's "
              "ranks (all threads) used per step over the same cycles, median over steps, mean "
              "over jobs, median over repeats — what a configuration costs in compute, which "
              "wall time on a shared 2-core box blurs (– for results recorded without it)."]
    return "\n".join(lines)


_LOG_RE = re.compile(r"batch (\d+) (\w+): .*?boost (\d+)")


def policy_series(job: dict) -> list[tuple[float, str, int | None]]:
    """(wall time, policy event kind, boost after it) of one job, time-ordered.

    From the job's Chrome trace (instant events with cat "policy" and
    args.boost) if it has any, else from the ``horovod_prio`` logger records
    ("... batch N <kind>: ... boost B ...")."""
    out = []
    t0 = (job.get("meta") or {}).get("t_process_start")
    for e in job.get("trace_events", []):
        args = e.get("args") or {}
        if e.get("cat") != "policy" and "boost" not in args:
            continue
        ts = e.get("ts_us")
        if ts is None:
            continue
        ts = float(ts) / 1e6
        if ts < 1e9:           # relative trace clock: assume it starts with the process
            if t0 is None:
                continue
            ts += t0
        out.append((ts, str(e.get("name")), args.get("boost")))
    if not out:
        for r in job.get("events", []):
            m = _LOG_RE.search(r.get("msg", ""))
            if m and r.get("t"):
                out.append((float(r["t"]), m.group(2), int(m.group(3))))
    return sorted(out, key=lambda x: x[0])


def job_events(job: dict) -> list[tuple[float, str]]:
    """(wall time, 'raise'|'decay'): where the job's priority boost went up or down."""
    ev, prev = [], 0
    for t, kind, boost in policy_series(job):
        if kind == "decay" or (boost is not None and boost < prev):
            ev.append((t, "decay"))
        elif boost is not None and boost > prev:
            ev.append((t, "raise"))
        if boost is not None:
            prev = boost
    return ev


def plot(results: dict, path: Path, max_panels: int = 8) -> Path | None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in results.get("runs", []) if r.get("status") == "ok"
            and (r["scenario"] in ("a", "b") or r["repeat"] == 0)]
    rep0 = [r for r in runs if r["repeat"] == 0] or runs
    rep0 = sorted(rep0, key=lambda r: ("abcs".index(r["scenario"]), r["rate"], r["batch"]))[:max_panels]
    if not rep0:
        return None
    n = len(rep0)
    fig, axes = plt.subplots(n, 1, figsize=(8, 1.6 * n + 0.6), dpi=70, squeeze=False, sharex=False)
    colors = ["tab:blue", "tab:orange", "tab:green"]
    for ax, r in zip(axes[:, 0], rep0):
        t_go = r.get("t_go") or 0
        ymax = 0.0
        for i, j in enumerate(r["jobs"]):
            st = measured_steps(j)
            xs = [e - t_go for _, e in st]
            ys = [e - s for s, e in st]
            ymax = max([ymax] + ys)
            ax.plot(xs, ys, ".-", color=colors[i % 3], lw=1, ms=3,
                    label=f"{j['name']} {SHORT.get(j['impl'], j['impl'])}")
        for i, j in enumerate(r["jobs"]):
            for t, k in job_events(j):
                ax.plot([t - t_go], [ymax * (1.08 if k == "raise" else 1.02)],
                        "^" if k == "raise" else "v", color=colors[i % 3], ms=5)
        win = overlap_window(r) if len(r["jobs"]) > 1 else None
        if win:
            ax.axvspan(win[0] - t_go, win[1] - t_go, color="0.92", zorder=0)
        ax.set_ylim(0, ymax * 1.15 if ymax else 1)
        ax.set_ylabel("s/step", fontsize=8)
        ax.set_title(f"{r['scenario']}: {'+'.join(SHORT.get(c, c) for c in r['config'])} "
                     f"@ {r['rate']}, batch {r['batch']}", fontsize=8, loc="left")
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="lower right", ncol=3)
    axes[-1, 0].set_xlabel("seconds since go (grey: both jobs measuring; ▲ boost raise, ▼ decay)",
                           fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_sweep(results: dict, path: Path) -> Path | None:
    """Speedup vs per-rank batch, one line per (scenario, implementation, rate)."""
    rows = [r for r in summarize(results) if r["scenario"] in ("c", "s") and r.get("runs_ok")
            and "horovod" not in r["config"] and r.get("speedup")]
    if not rows:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.4), dpi=80)
    keys = sorted({(r["scenario"], "+".join(r["config"]), r["rate"]) for r in rows},
                  key=lambda k: (k[0], k[1], parse_rate_bits_per_s(k[2])))
    for scen, cfg, rate in keys:
        rr = sorted([r for r in rows if (r["scenario"], "+".join(r["config"]), r["rate"])
                     == (scen, cfg, rate)], key=lambda r: r["batch"])
        ax.plot([r["batch"] for r in rr], [r["speedup"] for r in rr], "o-" if scen == "s" else "s--",
                label="%s %s @ %s" % ("1 job" if scen == "s" else "2 jobs", cfg, rate))
    ax.axhline(1.0, color="0.5", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch per rank (compute per step)")
    ax.set_ylabel("speedup vs plain Horovod")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(results: dict, out: Path) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(results)
    (out / "results.md").write_text(md + "\n")
    written = {"md": out / "results.md"}
    p = plot(results, out / "steps.png")
    if p:
        written["png"] = p
    s = plot_sweep(results, out / "sweep.png")
    if s:
        written["sweep_png"] = s
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.report")
    ap.add_argument("results", help="results.json written by benchmarks.run")
    ap.add_argument("--out", help="output dir (default: next to results.json)")
    a = ap.parse_args(argv)
    res = json.loads(Path(a.results).read_text())
    w = write_report(res, Path(a.out) if a.out else Path(a.results).parent)
    print(markdown(res))
    print("wrote " + ", ".join(str(v) for v in w.values()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
