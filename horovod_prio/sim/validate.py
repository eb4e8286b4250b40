"""Validation of the simulator against the emulated-link harness.

The harness (``benchmarks/``) runs 2-rank Horovod jobs of a 784-2048-2048-
256-10 MLP (6,331,146 params, 25.3 MB fp32 gradients), batch 32 per rank,
1 TF thread, every job's ranks pinned to one core, inside a network namespace
whose loopback is shaped to 1 Gbit/s by ``tc tbf``. Every byte every rank of
every job sends crosses that one qdisc: the simulator's ``topology="bus"``
(ring allreduce on 2 ranks puts 2(N-1)*S = 2 x 25.3 MB on the link per step).

Reference, measured with plain Horovod on the first harness: 0.45 s/step alone,
0.80-0.84 s/step with a second identical job on the link; comm-only floor
0.40 s / 0.80 s. Measurements the harness writes later to
``results/bench/*/results.json(.gz)`` are added to the table when present.
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import statistics
from typing import Dict, List, Optional, Tuple

from ..method.config import PriorityConfig
from .engine import JobSpec, LinkConfig, comm_floor, simulate, window_steps
from .profiles import Profile, load_profile, mlp

#: (label, jobs, measured low, measured high) on the first harness
REFERENCE = (("1 job, Horovod", 1, 0.45, 0.45), ("2 jobs, Horovod", 2, 0.80, 0.84))
MEASURED_FLOOR = {1: 0.40, 2: 0.80}
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_PROFILE = os.path.join(REPO, "results", "sim", "profile_mlp_b32.json")
MEASURED_BATCHES = (8, 32, 128)
#: compute seconds per step (fwd+bwd, batch 32, 1 thread) if no measured profile is found
FALLBACK_COMPUTE_S = 0.0305


def harness_link(bandwidth_bits: float = 1e9) -> LinkConfig:
    # ~20 us per message hop on loopback; Horovod defaults for cycle/fusion
    return LinkConfig(bandwidth=bandwidth_bits / 8, latency=20e-6, topology="bus")


def harness_profile(path: Optional[str] = None, ranks_per_core: float = 2.0,
                    batch: int = 32) -> Profile:
    """The MLP profile: measured by :mod:`benchmarks.profile_model` if
    ``path`` (default ``results/sim/profile_mlp_b32.json``) exists,
    else the FLOP-split MLP with :data:`FALLBACK_COMPUTE_S`. Compute times are
    multiplied by ``ranks_per_core`` (the harness pins both ranks of a job to
    one core, so they time-share it)."""
    if path:
        return load_profile(path).scaled(ranks_per_core)
    # the measured profile with the largest batch <= batch, scaled linearly
    for b in sorted((b for b in MEASURED_BATCHES if b <= batch), reverse=True):
        p = DEFAULT_PROFILE.replace("_b32", f"_b{b}")
        if os.path.exists(p):
            return load_profile(p).scaled(ranks_per_core * batch / b)
    return mlp(compute_s=FALLBACK_COMPUTE_S * batch / 32).scaled(ranks_per_core)


def measured_from_harness(pattern: Optional[str] = None) -> Dict[Tuple[str, int], List[float]]:
    """``{(impl, jobs): [median step time per job and repeat]}`` for MLP
    batch-32 1gbit runs found in the harness's results files (all jobs of a
    run with the same impl). Unreadable files are skipped."""
    pattern = pattern or os.path.join(REPO, "results", "bench", "*", "results.json*")
    out: Dict[Tuple[str, int], List[float]] = {}
    for path in sorted(glob.glob(pattern)):
        try:
            # the benchmarks store results gzip-compressed (benchmarks/results_io.py)
            with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
                data = json.load(f)
            for run in data.get("runs", []):
                cfg = run.get("config") or []
                if (run.get("status") != "ok" or len(set(cfg)) != 1
                        or str(run.get("rate")).lower() not in ("1gbit", "1000mbit")
                        or run.get("batch") != 32):
                    continue
                if any(j.get("model", "mlp") != "mlp" for j in run.get("jobs", [])):
                    continue
                for j in run.get("jobs", []):
                    d = [s["t_end"] - s["t_start"] for s in j.get("steps", [])
                         if not s.get("warmup")]
                    if d:
                        out.setdefault((cfg[0], len(cfg)), []).append(statistics.median(d))
        except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def _sim_mean(profile: Profile, jobs: int, mode: str, link: LinkConfig, steps: int,
              pcfg: PriorityConfig, grad_order: str = "backprop") -> float:
    specs = [JobSpec(profile, 2, steps, start=0.0, jitter=0.05, seed=1, grad_order=grad_order)
             for _ in range(jobs)]
    r = simulate(specs, mode, link, pcfg)
    xs = [x for j in range(jobs) for x in window_steps(r, j, skip=2)]
    return statistics.fmean(xs)


def validate(profile_path: Optional[str] = None, steps: int = 60,
             ranks_per_core: float = 2.0,
             priority: Optional[PriorityConfig] = None, grad_order: str = "inline") -> Dict:
    """Simulated vs measured step times for the harness configs, the
    gradients produced in ``grad_order`` (:func:`.engine.gradient_ready`;
    ``"inline"``, the default: the harness's jobs run TensorFlow on one
    thread)."""
    prof = harness_profile(profile_path, ranks_per_core)
    link = harness_link()
    pcfg = priority or PriorityConfig.from_env({})
    harness = measured_from_harness()
    rows = []
    for label, k, lo, hi in REFERENCE:
        sim = _sim_mean(prof, k, "fifo", link, steps, pcfg, grad_order)
        mid = (lo + hi) / 2
        row = {"config": label, "jobs": k, "mode": "fifo", "sim_s": sim,
               "measured_s": [lo, hi], "error": sim / mid - 1,
               "within_15pct": abs(sim / mid - 1) <= 0.15,
               "sim_floor_s": k * comm_floor(prof, 2, link), "measured_floor_s": MEASURED_FLOOR[k]}
        h = harness.get(("horovod", k))
        if h:
            row["harness_latest_s"] = statistics.median(h)
            row["error_vs_harness"] = sim / row["harness_latest_s"] - 1
        rows.append(row)
    predictions = []
    for k in (1, 2):
        for mode in ("priority", "arbiter", "adaptive"):
            p = {"jobs": k, "mode": mode,
                 "sim_s": _sim_mean(prof, k, mode, link, steps, pcfg, grad_order)}
            h = harness.get(("prio", k))
            if h and mode == "priority":
                p["harness_latest_s"] = statistics.median(h)
            predictions.append(p)
    sweep = predict_harness_sweep(steps=steps, ranks_per_core=ranks_per_core, priority=pcfg,
                                  grad_order=grad_order)
    balanced = predict_harness_sweep(("2gbit", "4gbit", "8gbit"), (128, 256, 512), steps=steps,
                                     ranks_per_core=ranks_per_core, priority=pcfg,
                                     grad_order=grad_order)
    return {"profile": prof.as_dict(), "compute_s": prof.compute_s, "harness_sweep": sweep,
            "harness_balanced": balanced,
            "ranks_per_core": ranks_per_core, "grad_order": grad_order, "link": vars(link),
            "rows": rows,
            "predictions": predictions,
            "harness_files": sorted(glob.glob(os.path.join(REPO, "results", "bench", "*",
                                                           "results.json*")))}


def predict_harness_sweep(rates=("500mbit", "1gbit", "2gbit"), batches=(8, 32, 128),
                          steps: int = 60, ranks_per_core: float = 2.0,
                          priority: Optional[PriorityConfig] = None,
                          grad_order: str = "backprop") -> List[Dict]:
    """Predictions for the harness's scenario c (two jobs on the shaped link,
    rate x per-rank batch): mean s/step per mode and the ratio to Horovod."""
    pcfg = priority or PriorityConfig.from_env({})
    bits = {"500mbit": 5e8, "1gbit": 1e9, "2gbit": 2e9, "4gbit": 4e9, "8gbit": 8e9}
    out = []
    for rate in rates:
        link = harness_link(bits[rate])
        for b in batches:
            prof = harness_profile(None, ranks_per_core, batch=b)
            row = {"rate": rate, "batch": b, "compute_s": prof.compute_s,
                   "comm_s": comm_floor(prof, 2, link)}
            for mode in ("fifo", "priority", "arbiter", "adaptive"):
                row[mode] = _sim_mean(prof, 2, mode, link, steps, pcfg, grad_order)
            out.append(row)
    return out


def sweep_table(rows: List[Dict]) -> str:
    lines = ["| rate | batch/rank | compute / comm per job (s) | Horovod s/step | priority | "
             "arbiter | adaptive | best speedup |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        best = r["fifo"] / min(r["priority"], r["arbiter"], r["adaptive"])
        lines.append(f"| {r['rate']} | {r['batch']} | {r['compute_s']:.3f} / {r['comm_s']:.3f} | "
                     f"{r['fifo']:.3f} | {r['priority'] / r['fifo']:.3f} | "
                     f"{r['arbiter'] / r['fifo']:.3f} | {r['adaptive'] / r['fifo']:.3f} | "
                     f"{best:.2f}x |")
    return "\n".join(lines)


def validation_table(v: Dict) -> str:
    files = any("harness_latest_s" in r for r in v["rows"])
    lines = ["| config | simulated s/step | measured s/step (first harness) | error | sim comm floor | "
             "measured floor |" + (" harness results file | error vs file |" if files else ""),
             "|---|---|---|---|---|---|" + ("---|---|" if files else "")]
    for r in v["rows"]:
        lo, hi = r["measured_s"]
        meas = f"{lo:.2f}" if lo == hi else f"{lo:.2f}-{hi:.2f}"
        line = (f"| {r['config']} | {r['sim_s']:.3f} | {meas} | {r['error'] * 100:+.1f}% "
                f"{'(ok)' if r['within_15pct'] else '(>15%)'} | {r['sim_floor_s']:.3f} | "
                f"{r['measured_floor_s']:.2f} |")
        if files:
            if "harness_latest_s" in r:
                line += (f" {r['harness_latest_s']:.3f} | {r['error_vs_harness'] * 100:+.1f}% |")
            else:
                line += " - | - |"
        lines.append(line)
    lines += ["", "| jobs | mode (horovod_prio, prediction) | simulated s/step |", "|---|---|---|"]
    for p in v["predictions"]:
        extra = f" (harness prio: {p['harness_latest_s']:.3f})" if "harness_latest_s" in p else ""
        lines.append(f"| {p['jobs']} | {p['mode']} | {p['sim_s']:.3f}{extra} |")
    if v.get("harness_sweep"):
        lines += ["", "Predicted for the harness's scenario c (two jobs; ratios to Horovod, "
                  "< 1 is faster):", "", sweep_table(v["harness_sweep"])]
    if v.get("harness_balanced"):
        lines += ["", "Predicted for faster links / larger batches (compute closer to comm; "
                  "batches above 128 scale the batch-128 profile linearly):", "",
                  sweep_table(v["harness_balanced"])]
    return "\n".join(lines)
