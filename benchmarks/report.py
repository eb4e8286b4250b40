"""Statistics, markdown table and PNG plots from a benchmark results dict.

    python -m benchmarks.report results/bench/quick [--out DIR]

Per run: each job's step times are its measured steps (warmup excluded); when
several jobs ran, only steps that lie entirely inside the overlap window
(every job measuring) count, so "two jobs on the link" means exactly that.
Per config: medians over repeats; a ratio ("speedup") is computed within one
repeat against the baseline run of the same repeat (plain Horovod alone for
scenario a, Horovod+Horovod for b/c), then the median over repeats is taken.

The ``cluster_*`` functions do the same for the testbed's cluster runs
(``benchmarks/cluster.py``: per-job shared/alone step times, uplink and core
usage from the testbed's counters, arbiter grants, recovery after a join).
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

from horovod_prio.method import units
from horovod_prio.sim.scenarios import recovery_steps

from . import bounds
from .netns import MTU as LO_MTU
from .testbed import CPU_FIELDS
from .testbed import MTU as TESTBED_MTU

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
    return (at(hi) - at(lo)) * 8 / (units.parse_rate_bits_per_s(run["rate"]) * (hi - lo))


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
        # ring allreduce on one shared lo: every rank sends 2(N-1)/N*S -> 2(N-1)*S per job,
        # in frames of lo's MTU
        out["floor"] = bounds.link_floor(
            len(jobs) * size * bounds.ring_allreduce_bytes(gb, size),
            units.parse_rate_bits_per_s(run["rate"]), LO_MTU) if gb else None
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
        f"| {floor_column(LO_MTU)} | speedup vs hvd | worst job vs hvd | link busy | job CPU s/step "
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
              "sends through the shared lo (2(N−1)·S per job), counted in bytes on the wire "
              "as its tbf counts them (TCP/IPv4 frames: MTU + 14 bytes per MTU − 52 of "
              "payload, benchmarks.bounds), ÷ rate. link busy: tc bytes "
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
                  key=lambda k: (k[0], k[1], units.parse_rate_bits_per_s(k[2])))
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


# ---------------------------------------------------------------- the testbed's cluster runs
# (benchmarks/cluster.py): statistics, tables and plots
CLUSTER_SHORT = {"horovod": "hvd", "prio": "prio", "arb": "arb"}


def cluster_job_label(d: dict) -> str:
    s = CLUSTER_SHORT[d["impl"]]
    if d.get("class") is not None:
        s += f"(c{d['class']})"
    if d.get("overlap"):
        s += "+ov"
    if d.get("nice") is not None:
        s += f" nice {d['nice']}"
    if d.get("start"):
        s += f"@{d['start']:g}s"
    return s


def _interp(samples: list[dict], key, t: float) -> float | None:
    """Counter value at wall time ``t`` (linear between samples)."""
    if not samples or t < samples[0]["t"] or t > samples[-1]["t"]:
        return None
    prev = samples[0]
    for s in samples:
        if s["t"] >= t:
            a, b = key(prev), key(s)
            if a is None or b is None:
                return None
            if s["t"] == prev["t"]:
                return b
            return a + (t - prev["t"]) / (s["t"] - prev["t"]) * (b - a)
        prev = s
    return key(samples[-1])


def _host_sent(host):
    return lambda s: (s.get("hosts", {}).get(host) or [None])[0]


def uplink_usage(rec: dict, lo: float, hi: float) -> dict | None:
    """Uplink utilisation per direction and each job's share of the uplink bytes
    over [lo, hi]. A job's bytes = what its two hosts sent into the fabric
    (veth counters): rank 0 -> rank 1 crosses A->B, rank 1 -> rank 0 B->A (plus
    the jobs' small control traffic to head/arbiter)."""
    samples = rec.get("uplink_samples") or []
    if hi - lo < 0.3 or len(samples) < 2:
        return None
    rate = units.parse_rate_bits_per_s(rec["rate"])
    out = {}
    tot = 0.0
    for d in ("AB", "BA"):
        a, b = _interp(samples, lambda s: s[d], lo), _interp(samples, lambda s: s[d], hi)
        if a is None or b is None:
            return None
        out[d] = (b - a) * 8 / (rate * (hi - lo))
        tot += b - a
    shares = {}
    for j in rec.get("jobs", []):
        sent = 0.0
        for h in j.get("hosts") or []:
            a, b = _interp(samples, _host_sent(h), lo), _interp(samples, _host_sent(h), hi)
            if a is None or b is None:
                sent = None
                break
            sent += b - a
        shares[j["name"]] = None if sent is None or tot <= 0 else sent / tot
    out["share"] = shares
    return out


def _core_order(cpu: str) -> int:
    """Sort key of a /proc/stat core name: cpu2 before cpu10."""
    return int(cpu[3:]) if cpu[3:].isdigit() else 0


def core_usage(rec: dict, lo: float, hi: float) -> dict | None:
    """Per core, the fraction of [lo, hi] it spent in user (incl. nice), system
    and interrupt (irq + softirq: the kernel's packet processing on the
    testbed's veths, bridge and tbf lands here, on whichever core it runs) time,
    and busy = all but idle and iowait; from /proc/stat in the samples."""
    samples = [s for s in rec.get("uplink_samples") or [] if s.get("cpu")]
    if hi - lo < 0.3 or len(samples) < 2:
        return None
    idx = {k: i for i, k in enumerate(CPU_FIELDS)}
    out = {}
    for cpu in sorted(samples[0]["cpu"], key=_core_order):
        def field(name, cpu=cpu):
            return lambda s: (s["cpu"].get(cpu) or [None] * len(idx))[idx[name]]

        d = {}
        for name in CPU_FIELDS:
            a, b = _interp(samples, field(name), lo), _interp(samples, field(name), hi)
            if a is None or b is None:
                d = None
                break
            d[name] = b - a
        tot = sum(d.values()) if d else 0
        if not d or tot <= 0:
            continue
        out[cpu] = {"user": (d["user"] + d["nice"]) / tot, "system": d["system"] / tot,
                    "interrupt": (d["irq"] + d["softirq"]) / tot,
                    "busy": 1 - (d["idle"] + d["iowait"]) / tot}
    return out or None


def cluster_run_stats(rec: dict, mtu: int = TESTBED_MTU) -> dict:
    """Per job: median s/step over all measured steps, while every job was
    measuring ("shared"), and outside that window ("alone"); the shared window;
    uplink usage over it; comm floor (wire bytes in frames of the uplink's ``mtu``)."""
    jobs = rec.get("jobs", [])
    steps = [measured_steps(j) for j in jobs]
    win = None
    if len(jobs) > 1 and all(steps):
        lo, hi = max(s[0][0] for s in steps), min(s[-1][1] for s in steps)
        win = (lo, hi) if hi > lo else None
    out = {"window": win, "jobs": []}
    for j, st in zip(jobs, steps):
        d_all = [e - s for s, e in st]
        if win:
            d_sh = [e - s for s, e in st if s >= win[0] - 1e-6 and e <= win[1] + 1e-6]
            d_al = [e - s for s, e in st if e <= win[0] + 1e-6 or s >= win[1] - 1e-6]
        else:
            d_sh, d_al = (d_all, []) if len(jobs) == 1 else ([], d_all)
        pol = policy_series(j)
        # ran alone before the join: at least one whole step before the others
        # measured (jobs started together begin a few ms apart; that is no join)
        first = bool(win and any(e <= win[0] + 1e-6 for _, e in st))
        rec_steps = None
        if first and d_al:
            rec_steps = recovery_steps([(s, e - s) for s, e in st], win[0] - 1e-6,
                                       median(d_al))
        out["jobs"].append({
            "name": j["name"], "label": j.get("label"), "impl": j.get("impl"),
            "n": len(d_all), "median": median(d_all),
            "n_shared": len(d_sh), "median_shared": median(d_sh),
            "n_alone": len(d_al), "median_alone": median(d_al),
            "recovery": rec_steps, "ran_first": first,
            "max_boost": max((b for _, _, b in pol if b is not None), default=None),
            "raises": sum(1 for _, k in job_events(j) if k == "raise")})
    shared = [x["median_shared"] for x in out["jobs"]]
    out["mean_shared"] = statistics.fmean(shared) if shared and None not in shared else None
    span = win
    if span is None and any(steps):
        span = (min(s[0][0] for s in steps if s), max(s[-1][1] for s in steps if s))
    out["uplink"] = uplink_usage(rec, *span) if span else None
    out["cores"] = core_usage(rec, *span) if span else None
    meta = (jobs[0].get("meta") or {}) if jobs else {}
    gb, size = meta.get("grad_bytes"), meta.get("size", 2)
    # ring allreduce: each rank sends 2(n-1)/n x S (2 ranks: S), i.e. that per job and
    # direction of the uplink, in frames of its MTU
    out["floor"] = bounds.ring_floor(gb, size, units.parse_rate_bits_per_s(rec["rate"]),
                                     max(len(jobs), 1), mtu) if gb else None
    return out


def _grants(rec: dict, link: str) -> tuple[float | None, float | None]:
    """(grants, grants that waited) on the arbiter link ``link`` between the go and the end."""
    a, b = rec.get("arbiter_stats_go"), rec.get("arbiter_stats_end")
    if not b:
        return None, None
    lb = (b.get("links") or {}).get(link) or {}
    la = ((a or {}).get("links") or {}).get(link) or {}
    g = lb.get("grants", 0) - la.get("grants", 0)
    w = lb.get("waits", 0) - la.get("waits", 0)
    return g, w


def cluster_mtu(meta: dict) -> int:
    """The uplink's MTU of a ``benchmarks.cluster`` run (runs recorded before the
    runner recorded it ran on the same veths)."""
    return int(meta.get("mtu", TESTBED_MTU))


def floor_column(mtu: int) -> str:
    """The results tables' link-floor column, naming its unit."""
    return f"comm floor s/step ({bounds.floor_label(mtu)})"


def cluster_summarize(results: dict) -> tuple[list[dict], list[dict]]:
    """(rows per variant, rows per variant x job), medians over repeats; ratios
    against the hvd run of the same repeat."""
    runs = [r for r in results.get("runs", [])]
    mtu = cluster_mtu(results.get("meta", {}))
    stats = {(r["variant"], r["repeat"]): cluster_run_stats(r, mtu) for r in runs
             if r.get("status") == "ok"}
    order = results.get("meta", {}).get("variants") or list(dict.fromkeys(
        r["variant"] for r in runs))
    rows, jrows = [], []
    for v in order:
        rs = [r for r in runs if r.get("variant") == v]
        ok = [r for r in rs if (v, r["repeat"]) in stats]
        row = {"variant": v, "runs": len(rs), "runs_ok": len(ok),
               "config": (rs[0].get("config") if rs else None)}
        rows.append(row)
        if not ok:
            continue
        st = [stats[(v, r["repeat"])] for r in ok]
        njobs = len(st[0]["jobs"])
        row["job_s"] = [median([s["jobs"][i]["median_shared"] for s in st])
                        for i in range(njobs)]
        row["mean_s"] = median([s["mean_shared"] for s in st])
        row["floor_s"] = median([s["floor"] for s in st])
        for d in ("AB", "BA"):
            row[f"busy_{d}"] = median([(s["uplink"] or {}).get(d) for s in st])
        cores = sorted({c for x in st for c in (x.get("cores") or {})}, key=_core_order)
        row["cores"] = {c: {k: median([((x.get("cores") or {}).get(c) or {}).get(k)
                                              for x in st])
                            for k in ("busy", "user", "system", "interrupt")}
                        for c in cores}
        sp, worst = [], []
        per_job_ratio = [[] for _ in range(njobs)]
        for r in ok:
            b = stats.get(("hvd", r["repeat"]))
            s = stats[(v, r["repeat"])]
            if not b:
                continue
            if b["mean_shared"] and s["mean_shared"]:
                sp.append(b["mean_shared"] / s["mean_shared"])
            ch = []
            for i in range(njobs):
                bj, sj = b["jobs"][i]["median_shared"], s["jobs"][i]["median_shared"]
                if bj and sj:
                    per_job_ratio[i].append(bj / sj)
                    ch.append(sj / bj - 1)
            if ch:
                worst.append(max(ch))
        row["speedup"] = median(sp)
        row["speedup_range"] = (min(sp), max(sp)) if len(sp) > 1 and v != "hvd" else None
        row["worst_job_change"] = median(worst)
        waits = []
        for r in ok:
            s = stats[(v, r["repeat"])]
            for j in s["jobs"]:
                w = (r.get("arbiter_waits") or {}).get(j["name"])
                if w and w.get("chunks") and j["n"]:
                    waits.append(w.get("wait_union_s", w["wait_total_s"]) / j["n"])
        row["wait_per_step_s"] = median(waits)
        link = results.get("meta", {}).get("link", "uplink")
        gw = [_grants(r, link) for r in ok if r.get("arbiter_stats_end")]
        if gw:
            row["grants"] = median([g for g, _ in gw])
            row["grants_waited"] = median([w for _, w in gw])
        for i in range(njobs):
            js = [s["jobs"][i] for s in st]
            shares = [((s["uplink"] or {}).get("share") or {}).get(js[0]["name"]) for s in st]
            jrows.append({
                "variant": v, "job": js[0]["name"], "label": js[0]["label"],
                "median": median([x["median"] for x in js]),
                "median_shared": median([x["median_shared"] for x in js]),
                "median_alone": median([x["median_alone"] for x in js]),
                "vs_hvd": median(per_job_ratio[i]),
                "share": median(shares),
                "max_boost": max((x["max_boost"] for x in js if x["max_boost"] is not None),
                                 default=None),
                "raises": median([x["raises"] for x in js]),
                "recovery": [x["recovery"] for x in js] if js[0]["ran_first"] else None})
    return rows, jrows


def cluster_markdown(results: dict) -> str:
    meta = results.get("meta", {})
    f = fmt
    rows, jrows = cluster_summarize(results)
    jobs = "; ".join(
        f"{cluster_job_label(d)} {d.get('model')} batch {d.get('batch')}/rank {d.get('steps')} steps"
        + (f" {' '.join(f'{k}={v}' for k, v in d['env'].items())}" if d.get("env") else "")
        for d in meta.get("jobs", []))
    lines = [
        f"Command: `{meta.get('command')}` — {meta.get('date')}, git {meta.get('git')}, "
        f"{meta.get('ncpu')} cores, transport {meta.get('transport')}, uplink {meta.get('rate')} "
        f"each way, {meta.get('warmup')} warmup steps, repeats={meta.get('repeats')}, "
        f"pin={meta.get('pin')}, jobs: {jobs}",
        "",
        f"| variant | jobs | job s/step (shared window) | mean s/step "
        f"| {floor_column(cluster_mtu(meta))} "
        "| speedup vs hvd | worst job vs hvd | uplink busy A→B / B→A | arbiter wait / step "
        "| grants queued | runs ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cfg = " + ".join(r.get("config") or [])
        if not r["runs_ok"]:
            lines.append(f"| {r['variant']} | {cfg} | | | | | | | | | 0/{r['runs']} |")
            continue
        w = r.get("wait_per_step_s")
        q = ("–" if r.get("grants") is None
             else f"{r['grants_waited']:.0f}/{r['grants']:.0f}")
        lines.append(
            f"| {r['variant']} | {cfg} | {' / '.join(f(x) for x in r['job_s'])} "
            f"| {f(r['mean_s'])} | {f(r['floor_s'])} | {ratio_cell(r['speedup'], r.get('speedup_range'))} "
            f"| {f(r['worst_job_change'], '{:+.1%}')} "
            f"| {f(r.get('busy_AB'), '{:.0%}')} / {f(r.get('busy_BA'), '{:.0%}')} "
            f"| {'–' if w is None else f'{w * 1e3:.0f} ms'} | {q} | {r['runs_ok']}/{r['runs']} |")
    lines += ["", "| variant | job | s/step all | s/step shared | s/step alone | vs hvd (same job) "
              "| uplink share | max boost | boost raises | recovery, per repeat |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for j in jrows:
        lines.append(
            f"| {j['variant']} | {j['job']} {j['label']} | {f(j['median'])} "
            f"| {f(j['median_shared'])} | {f(j['median_alone'])} | {f(j['vs_hvd'], '{:.2f}×')} "
            f"| {f(j['share'], '{:.0%}')} | {'–' if j['max_boost'] is None else j['max_boost']} "
            f"| {f(j['raises'], '{:.0f}')} "
            f"| {'–' if j['recovery'] is None else ' / '.join('never' if x is None else str(x) for x in j['recovery'])} |")
    core_rows = [r for r in rows if r.get("cores")]
    if core_rows:
        lines += ["", "| variant | core | busy | user | system | irq + softirq |",
                  "|---|---|---|---|---|---|"]
        for r in core_rows:
            for c, u in r["cores"].items():
                lines.append(f"| {r['variant']} | {c} | "
                             + " | ".join(f(u[k], "{:.0%}") for k in
                                          ("busy", "user", "system", "interrupt")) + " |")
    for r in results.get("runs", []):
        if r.get("status") != "ok":
            lines += ["", f"Failed ({r.get('label')}): "
                          f"{(r.get('error') or '').splitlines()[0][:200]}"]
    lines += notes_and_load(results, meta)
    lines += ["", "Shared window: while every job was measuring (warmup excluded; a job with "
              "start=S is released S s after the others). s/step: median over repeats of each "
              "job's median step time; 'alone' = its measured steps outside the shared window. "
              "speedup: hvd mean s/step ÷ this variant's, same repeat, median over repeats "
              "(in brackets: the lowest and highest per-repeat ratio); "
              "vs hvd (same job): hvd job's s/step ÷ this job's. comm floor: every rank sends S "
              "(gradient bytes) across the uplink per step, each direction carries S per job, "
              "counted in bytes on the wire as the uplink's tbf counts them (TCP/IPv4 frames "
              "over Ethernet: MTU + 14 bytes per MTU − 52 of payload, benchmarks.bounds): "
              "jobs × wire(S)·8/rate. uplink busy: tc bytes sent by the tbf of each uplink end ÷ "
              "(rate × time) over the shared window. uplink share: bytes the job's two hosts sent "
              "into the fabric ÷ uplink bytes (both directions), same window. arbiter wait / "
              "step: union of the job's 'arbiter' trace spans (request → grant) per measured "
              "step, median over jobs and repeats. grants queued: arbiter --stats (waits / "
              "grants on link 'uplink') between the common start and the end. boost: the "
              "horovod_prio logger's policy events (rank 0). recovery (a job that ran alone "
              "at least one whole step before the others joined): its steps from the join until one is within 10 % "
              "of its alone s/step, counting that one ('never': none was), per repeat; "
              "the simulator's rule (horovod_prio.sim.scenarios.recovery_steps). "
              "core: fraction of the shared "
              "window (of the whole span with one job) each core spent busy, in user, "
              "system and interrupt time (/proc/stat; the kernel's packet processing for "
              "every job's traffic counts on whichever core it runs), median over repeats; "
              f"pin={meta.get('pin')} (job: job i's hosts on core i mod cores)."]
    return "\n".join(lines)


def _first_ok_runs(results: dict) -> list[dict]:
    seen, out = set(), []
    for r in sorted(results.get("runs", []), key=lambda r: r.get("repeat", 0)):
        if r.get("status") == "ok" and r["variant"] not in seen:
            seen.add(r["variant"])
            out.append(r)
    return out


def _series(samples: list[dict], key, t0: float):
    xs, ys = [], []
    for a, b in zip(samples, samples[1:]):
        va, vb = key(a), key(b)
        if va is None or vb is None or b["t"] <= a["t"]:
            continue
        xs.append((a["t"] + b["t"]) / 2 - t0)
        ys.append((vb - va) / (b["t"] - a["t"]))
    return xs, ys


def _mark_joins(ax, r: dict, t0: float) -> None:
    """A dotted line where a job with start=S was released."""
    for name, t in (r.get("released") or {}).items():
        ax.axvline(t - t0, color="0.4", ls=":", lw=0.8)
        ax.text(t - t0, ax.get_ylim()[1], f" {name} joins", fontsize=6, va="top", color="0.3")


def cluster_plot(results: dict, out: Path) -> list[Path]:
    """steps.png, link.png, boost.png: one panel per variant (its first ok repeat)."""
    runs = _first_ok_runs(results)
    if not runs:
        return []
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
              "tab:pink", "tab:gray"]
    written = []
    n = len(runs)

    def title(r):
        return (f"{r['variant']}: {' + '.join(r.get('config') or [])} "
                f"(repeat {r['repeat'] + 1}, {r.get('transport')}, uplink {r.get('rate')})")

    # steps
    fig, axes = plt.subplots(n, 1, figsize=(8, 1.8 * n + 0.6), dpi=70, squeeze=False)
    for ax, r in zip(axes[:, 0], runs):
        t0 = r.get("t_go") or 0
        ymax = 0.0
        for i, j in enumerate(r["jobs"]):
            st = measured_steps(j)
            ys = [e - s for s, e in st]
            ymax = max([ymax] + ys)
            ax.plot([e - t0 for _, e in st], ys, ".-", color=colors[i % 8], lw=1, ms=3,
                    label=f"{j['name']} {j.get('label') or j.get('impl')}")
        for i, j in enumerate(r["jobs"]):
            for t, k in job_events(j):
                ax.plot([t - t0], [ymax * (1.08 if k == "raise" else 1.02)],
                        "^" if k == "raise" else "v", color=colors[i % 8], ms=5)
        win = cluster_run_stats(r)["window"]
        if win:
            ax.axvspan(win[0] - t0, win[1] - t0, color="0.92", zorder=0)
        _mark_joins(ax, r, t0)
        ax.set_ylim(0, ymax * 1.15 if ymax else 1)
        ax.set_ylabel("s/step", fontsize=8)
        ax.set_title(title(r), fontsize=8, loc="left")
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="lower right", ncol=4)
    axes[-1, 0].set_xlabel("seconds since the common start (grey: every job measuring; "
                           "▲ boost raise, ▼ decay)", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "steps.png")
    plt.close(fig)
    written.append(out / "steps.png")

    # link utilisation + per-job share
    fig, axes = plt.subplots(n, 1, figsize=(8, 1.8 * n + 0.6), dpi=70, squeeze=False)
    for ax, r in zip(axes[:, 0], runs):
        t0 = r.get("t_go") or 0
        samples = r.get("uplink_samples") or []
        rate = units.parse_rate_bytes_per_s(r["rate"])
        xs = None
        stack = []
        for i, j in enumerate(r["jobs"]):
            series = [_series(samples, _host_sent(h), t0) for h in j.get("hosts") or []]
            if len(series) != 2 or not series[0][0] or len(series[0][0]) != len(series[1][0]):
                stack = None
                break
            xs = series[0][0]
            stack.append(([100 * (a + b) / (2 * rate) for a, b in zip(series[0][1],
                                                                        series[1][1])],
                          f"{j['name']} {j.get('label') or ''} (both directions)"))
        if stack:
            ax.stackplot(xs, [s for s, _ in stack], labels=[lab for _, lab in stack],
                         colors=colors[:len(stack)], alpha=0.35)
        for d, st in (("AB", "-"), ("BA", "--")):
            x, y = _series(samples, lambda s, d=d: s[d], t0)
            ax.plot(x, [100 * v / rate for v in y], st, color="k", lw=0.8,
                    label=f"uplink {d[0]}→{d[1]}")
        ax.set_ylim(0, 110)
        spans = [measured_steps(j) for j in r["jobs"]]
        spans = [s for s in spans if s]
        if spans:   # from 1 s before the first measured step to just after the last
            ax.set_xlim(min(s[0][0] for s in spans) - t0 - 1,
                        max(s[-1][1] for s in spans) - t0 + 0.5)
        ax.set_ylabel("% of rate", fontsize=8)
        ax.set_title(title(r), fontsize=8, loc="left")
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, loc="lower right", ncol=3)
    axes[-1, 0].set_xlabel("seconds since the common start (lines: tc counters of the uplink "
                           "per direction; areas: each job's hosts' bytes, both directions, "
                           "÷ 2·rate)", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "link.png")
    plt.close(fig)
    written.append(out / "link.png")

    # boost: every ok run with a prio job (the policy reacts to each run's own noise)
    prio_runs = sorted([r for r in results.get("runs", []) if r.get("status") == "ok"
                        and any(j.get("impl") == "prio" for j in r["jobs"])],
                       key=lambda r: (r["variant"], r["repeat"]))[:8]
    if prio_runs:
        m = len(prio_runs)
        fig, axes = plt.subplots(m, 1, figsize=(8, 1.5 * m + 0.6), dpi=70, squeeze=False)
        for ax, r in zip(axes[:, 0], prio_runs):
            t0 = r.get("t_go") or 0
            end = max((measured_steps(j)[-1][1] for j in r["jobs"]
                       if measured_steps(j)), default=t0) - t0
            for i, j in enumerate(r["jobs"]):
                if j.get("impl") != "prio":
                    continue
                pts = [(t - t0, b) for t, _, b in policy_series(j) if b is not None]
                xs, ys = [min([0.0] + [x for x, _ in pts])], [0]
                for x, b in pts:
                    xs.append(x)
                    ys.append(b)
                xs.append(max(end, xs[-1]))
                ys.append(ys[-1])
                ax.step(xs, [y + 0.04 * i for y in ys], where="post", color=colors[i % 8],
                        label=f"{j['name']} {j.get('label') or ''}")
            top = max([1] + [b for j in r["jobs"] for _, _, b in policy_series(j)
                             if b is not None])
            ax.set_ylim(-0.3, top + 0.5)
            _mark_joins(ax, r, t0)
            ax.set_ylabel("boost", fontsize=8)
            ax.set_title(title(r), fontsize=8, loc="left")
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=7, loc="upper right", ncol=4)
        axes[-1, 0].set_xlabel("seconds since the common start (priority boost of the "
                               "input-side groups, from the horovod_prio logger on rank 0)",
                               fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "boost.png")
        plt.close(fig)
        written.append(out / "boost.png")
    return written


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


def bound_cells(base_s: float, ours_s: float, bound_s: float) -> tuple[str, str]:
    """A headline row's ratio and share of its bound's gain, side by side:
    ``("1.18×", "60%")``, or ``("1.03×", "no headroom (5%)")`` where the
    bound leaves less than 10 % (see ``benchmarks.bounds.capture``)."""
    from .bounds import capture
    c = capture(base_s, ours_s, bound_s)
    if c.share is None:
        return f"{c.ratio:.2f}×", f"no headroom ({c.headroom:.0%})"
    return f"{c.ratio:.2f}×", f"{c.share:.0%}"


def aa_line(pairs) -> str:
    """The testbed's resolution line from (A, A') pairs of identical runs."""
    from .bounds import aa_resolution
    return aa_resolution(pairs).text()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.report")
    ap.add_argument("results", help="a benchmarks.run output folder or its results.json(.gz)")
    ap.add_argument("--out", help="output dir (default: the results file's folder)")
    a = ap.parse_args(argv)
    from . import results_io
    path = results_io.results_path(a.results)
    res = results_io.load(path)
    w = write_report(res, Path(a.out) if a.out else path.parent)
    print(markdown(res))
    print("wrote " + ", ".join(str(v) for v in w.values()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
