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

Jobs that start together are simulated per repeat, at the relative phase
they had on the testbed in that repeat (job i's step starts as a fraction of
job 0's step in the shared window: :func:`phase_fractions`); the model keeps
a phase once set (fluid fair sharing has nothing that moves it, and where
compute dominates it pulls jobs into lock-step), while testbed jobs drift
apart, so at 0.5 ms apart it would simulate a lock-step the testbed did not
have. ``--no-phase``: 0.5 ms apart, one run per variant (the earlier model).

One parameter is fitted on the run itself, on the plain-Horovod variant only:
the compute time scale (the profile is measured one process alone; on the
testbed two ranks of a job share a core with their communication threads),
on the shared window, or, in a run where a job joins later, on the first
job's steps alone.
Every horovod_prio variant is then a prediction. Compared per job: the median
step time while all jobs ran (and, for a job joining later, the first job's
steps before it joined). Where the runs recorded their rank-0 trace's arbiter
waits, the model's grant waits go beside them, read the same way (union of
request -> grant over the job's measured steps, per step; the longest: the
``waits`` of :func:`check`). Written to ``DIR/sim_check.md`` / ``.json``
(``--no-write``: printed only, e.g. to try other costs).

``--calibrate ALONE`` measures the simulator's two job-side costs on another
testbed run, one job alone with the variants ``hvd,prio,spec`` (same rate,
batch and pinning): the compute scale on ``hvd``, then horovod_prio's per-step
cost (what its step costs beyond plain Horovod's: the model runs the same
fused collectives for both when nothing holds chunks back; at least 0) on
``prio``, then the job-to-arbiter round trip on ``spec``, each by bisection on
that job's step time. The two costs then go into every horovod_prio variant
of ``DIR`` (only its compute scale is fitted there), so the two-job rows are
predictions from one job measured alone. ``--step-cost`` / ``--arbiter-rtt``
give the costs directly; ``--collective-overhead T`` adds a cost per collective
to every variant, plain Horovod's included, and ``--collective-overhead fit``
fits it on ALONE's time with a released chunk in flight (see :func:`calibrate`;
a rough measure: docs/sim.md).
``--compute-scale calibrated`` also takes the compute scale from ALONE instead
of fitting it on ``DIR``'s plain Horovod run (with one core per job, a job's
compute does not depend on the other job), so that the plain-Horovod rows are
predictions too (``--compute-scale K`` gives it by hand). ``--replicas N`` (with
``--calibrate``) adds ALONE's plain-Horovod step-to-step variation as every job's
compute noise over N replicas seeded from ``--seed`` (:func:`make_noise`).
"""
from __future__ import annotations

import argparse
import bisect
import datetime as _dt
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from horovod_prio.method.config import PriorityConfig
from horovod_prio.method import units
from horovod_prio.sim.engine import JobSpec, LinkConfig, simulate
from horovod_prio.sim.profiles import Profile, load_profile

from . import report, testbed
from .traces import union_length
from .harness import git_rev

_MODE = {"hvd": "fifo", "prio": "priority", "spec": None}
_PHASE_GRID = 24


def _scaled(profile: Profile, k: float) -> Profile:
    return replace(profile, layers=tuple(replace(l, forward_s=l.forward_s * k,
                                                 backward_s=l.backward_s * k)
                                         for l in profile.layers))


def measured_medians(results: dict) -> dict:
    """variant -> per job medians (while shared, and alone), medians over repeats."""
    out = {}
    for v in results["meta"].get("variants") or []:
        stats = [report.cluster_run_stats(r) for r in results["runs"]
                 if r.get("variant") == v and r.get("status") == "ok"]
        if not stats:
            continue
        n = len(stats[0]["jobs"])
        out[v] = [{"shared": _med([s["jobs"][i]["median_shared"] for s in stats]),
                   "alone": _med([s["jobs"][i]["median_alone"] for s in stats])}
                  for i in range(n)]
    return out


def _measured_comm(results: dict, variant: str) -> float | None:
    """Job 0's time with a released chunk in flight per measured step (its rank-0
    trace's "allreduce" spans, union; ``arbiter_waits[job]["allreduce_union_s"]``,
    recorded since 2026-12-04), median over the variant's repeats; None if not
    recorded."""
    return _med([run_comm_s(r) for r in results["runs"]
                 if r.get("variant") == variant and r.get("status") == "ok"])


def run_comm_s(run: dict) -> float | None:
    """One run's job 0 time with a released chunk in flight per measured step (see
    :func:`_measured_comm`); None if not recorded."""
    if not run.get("jobs"):
        return None
    j = run["jobs"][0]
    aw = (run.get("arbiter_waits") or {}).get(j["name"]) or {}
    n = len(report.measured_steps(j))
    return aw["allreduce_union_s"] / n if aw.get("allreduce_union_s") is not None and n else None


def run_waits(run: dict) -> list[dict | None]:
    """One run's arbiter grant waits per job: ``{"wait": union of the job's request ->
    grant spans over its measured steps / those steps, "max": its longest wait}``
    (rank-0 trace, ``arbiter_waits``), or None for a job that recorded none."""
    out = []
    for j in run.get("jobs") or []:
        aw = (run.get("arbiter_waits") or {}).get(j["name"]) or {}
        n = len(report.measured_steps(j))
        if not aw.get("chunks") or not n:
            out.append(None)
            continue
        out.append({"wait": aw["wait_union_s"] / n, "max": aw["wait_max_ms"] / 1e3})
    return out


def _measured_waits(results: dict) -> dict:
    """variant -> per job the median over its repeats of :func:`run_waits` (None
    where not recorded)."""
    out = {}
    for v in results["meta"].get("variants") or []:
        per = [run_waits(r) for r in results["runs"]
               if r.get("variant") == v and r.get("status") == "ok"]
        if not per or not any(w for p in per for w in p):
            continue
        out[v] = [None if not any(p[i] for p in per) else
                  {k: _med([p[i][k] for p in per if p[i]]) for k in ("wait", "max")}
                  for i in range(len(per[0]))]
    return out


def phase_fractions(run: dict) -> list[float] | None:
    """Where each job's steps sit in job 0's step cycle during the shared window
    of one testbed run: for every measured step start of job i, the time since
    job 0's latest step start, as a fraction of job 0's median step there;
    median per job (job 0: 0). None for a run of one job, a job joining later,
    or too few steps."""
    jobs = run.get("jobs") or []
    if len(jobs) < 2 or any(float(j.get("start") or 0) > 0 for j in jobs):
        return None
    return _phase_of([report.measured_steps(j) for j in jobs])


def _phase_of(steps: list[list[tuple[float, float]]]) -> list[float] | None:
    """:func:`phase_fractions` of per-job (start, end) step lists."""
    if len(steps) < 2 or any(len(st) < 2 for st in steps):
        return None
    lo, hi = max(st[0][0] for st in steps), min(st[-1][1] for st in steps)
    t0 = [a for a, b in steps[0]]
    period = _med([b - a for a, b in steps[0] if a >= lo - 1e-6 and b <= hi + 1e-6])
    if not period or hi <= lo:
        return None
    out = [0.0]
    for st in steps[1:]:
        ds = []
        for a, _ in st:
            k = bisect.bisect_right(t0, a)          # job 0's steps started by a
            if lo - 1e-6 <= a <= hi and k:
                ds.append(((a - t0[k - 1]) / period) % 1.0)
        if not ds:
            return None
        out.append(_med(ds))
    return out


def _phases(results: dict) -> dict:
    """variant -> the phase fractions (see :func:`phase_fractions`) of each of its ok
    repeats; only for runs where all jobs start together."""
    out = {}
    for v in results["meta"].get("variants") or []:
        ph = [phase_fractions(r) for r in results["runs"]
              if r.get("variant") == v and r.get("status") == "ok"]
        ph = [x for x in ph if x]
        if ph:
            out[v] = ph
    return out


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def step_deviations(step_lists) -> tuple:
    """The step-to-step variation of one job's runs: each run's measured steps
    (seconds) minus that run's median, pooled over the runs (a run's own level is
    not variation: the runs' medians are what the check compares)."""
    out = []
    for st in step_lists:
        st = [x for x in st or [] if x is not None]
        if len(st) >= 2:
            m = statistics.median(st)
            out += [x - m for x in st]
    return tuple(out)


def noise_draws(results: dict, variant: str = "hvd") -> tuple:
    """:func:`step_deviations` of job 0's measured steps in ``variant``'s ok runs of a
    ``benchmarks.cluster`` record (plain Horovod of one job alone: the calibration
    run); empty where there are none."""
    return step_deviations([[b - a for a, b in report.measured_steps(r["jobs"][0])]
                            for r in results.get("runs") or []
                            if r.get("variant") == variant and r.get("status") == "ok"
                            and r.get("jobs")])


def make_noise(draws, replicas: int, seed: int = 0) -> dict | None:
    """The check's compute noise: each job's compute per step is stretched by one of
    ``draws`` (seconds, :func:`step_deviations`), drawn with replacement, in
    ``replicas`` simulations seeded ``seed``, ``seed`` + 1, ... (the job's index
    is in its stream too); the check reports the replicas' median and their range.
    None (the deterministic model) without draws or replicas."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"replicas must be an integer >= 0, got {replicas!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    draws = tuple(float(x) for x in draws or ())
    if not draws or not replicas:
        return None
    return {"draws": draws, "replicas": replicas, "seed": seed}


def noise_summary(noise: dict | None) -> dict | None:
    """What a result records of its noise (the draws themselves stay with the run)."""
    if not noise:
        return None
    d = sorted(noise["draws"])
    q = lambda f: d[min(len(d) - 1, int(f * len(d)))]
    return {"replicas": noise["replicas"], "seed": noise["seed"], "n": len(d),
            "sd_s": statistics.pstdev(d), "p10_s": q(0.10), "p90_s": q(0.90)}


def _sim_jobs(results: dict, variant: str, profile: Profile, offsets=None):
    meta = results["meta"]
    jobs, mode = [], _MODE.get(variant) or "fifo"
    for i, d in enumerate(meta["jobs"]):
        impl = "horovod" if variant == "hvd" else d["impl"]
        if variant == "spec" and impl == "arb":
            mode = "adaptive"
        elif variant == "spec" and impl == "prio" and mode == "fifo":
            mode = "priority"
        cls = d.get("class") if variant == "spec" else None
        start = (float(d.get("start") or 0.0) + 0.0005 * i if offsets is None
                 else offsets[i])
        jobs.append(JobSpec(profile, 2, int(d["steps"]) + int(meta["warmup"]),
                            start=start, name="job%d" % i,
                            seed=i, job_class=int(cls or 0), grad_order=grad_order(meta)))
    return jobs, mode


def grad_order(meta: dict) -> str:
    """The order the testbed's jobs produced their gradients in
    (:func:`horovod_prio.sim.engine.gradient_ready`): "inline" with one TensorFlow
    inter-op thread (the runner's default, and what TensorFlow picks for a process
    on one core), "backprop" with more or where the record does not say."""
    n = meta.get("inter_threads") or meta.get("threads")
    return "inline" if n is not None and int(n) == 1 else "backprop"


def _sim_stats(r, jobs, warmup):
    """Per job: median step while every job ran / outside that window (as run_stats)."""
    steps = [[(s.start, s.end) for s in r.steps[i][warmup:]] for i in range(len(jobs))]
    win = None
    if len(jobs) > 1 and all(steps):
        lo, hi = max(s[0][0] for s in steps), min(s[-1][1] for s in steps)
        win = (lo, hi) if hi > lo else None
    out = []
    for i, st in enumerate(steps):
        comm = wait = wmax = None
        gw = r.grant_waits[i] if i < len(r.grant_waits) else []
        if st and gw:
            # as the testbed's trace summary: request -> grant spans inside the job's
            # measured steps, their union per measured step, the longest
            inside = [(a, b) for a, b, _ in gw if a >= st[0][0] and b <= st[-1][1] + 0.01]
            if inside:
                wait = union_length(inside) / len(st)
                wmax = max(b - a for a, b in inside)
        if st and i < len(r.comm_spans):
            lo, hi = st[0][0], st[-1][1]
            comm = sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in r.comm_spans[i]) / len(st)
        if win:
            sh = [e - s for s, e in st if s >= win[0] - 1e-9 and e <= win[1] + 1e-9]
            al = [e - s for s, e in st if e <= win[0] + 1e-9 or s >= win[1] - 1e-9]
        else:
            sh, al = [e - s for s, e in st], []
        out.append({"shared": _med(sh), "alone": _med(al), "comm": comm, "wait": wait,
                    "wait_max": wmax})
    return out


def _link(meta, overhead: float = 0.0, rtt: float = 0.0, step: float = 0.0) -> LinkConfig:
    return LinkConfig(bandwidth=units.parse_rate_bytes_per_s(meta["rate"]), topology="nic",
                      arbiter_credit=int(meta.get("arbiter_credit") or 8 << 20),
                      arbiter_order=meta.get("arbiter_order") or "burst",
                      starvation_bound=int(meta.get("starvation_bound", 8)),
                      # runs recorded before the arbiter had a class reserve ran without one
                      arbiter_class_reserve=float(meta.get("arbiter_class_reserve", 0.0)),
                      collective_overhead=overhead, arbiter_rtt=rtt, step_overhead=step,
                      # the uplink carries TCP over Ethernet (runs recorded before the
                      # runner recorded the MTU ran on the same veths)
                      mtu=int(meta.get("mtu", testbed.MTU)))


def _bisect(err, lo, hi, geometric=False, n=40):
    """The root of ``err`` (increasing) in [lo, hi]; an end of the range if none inside."""
    for _ in range(n):
        mid = (lo * hi) ** 0.5 if geometric else (lo + hi) / 2
        if err(mid) > 0:
            hi = mid
        else:
            lo = mid
    return (lo * hi) ** 0.5 if geometric else (lo + hi) / 2


def _runner(results, profile, pcfg, phases=None, noise=None):
    """run(variant, k, ...) -> the simulated per-job stats. With ``phases`` (variant ->
    each repeat's testbed phase fractions, :func:`_phases`) each repeat is
    simulated on its own (a phase is an input, like a start offset), each job
    starting at the one of 24 offsets over a step whose simulated phase is
    nearest that repeat's; the per-job results are medians over the repeats."""
    meta = results["meta"]
    warmup = int(meta["warmup"])
    phases = phases or {}

    def once(variant, k, overhead, rtt, step, offsets, rep=None):
        jobs, mode = _sim_jobs(results, variant, _scaled(profile, k), offsets)
        if rep is not None:
            jobs = [replace(j, compute_noise=noise["draws"], seed=noise["seed"] + rep)
                    for j in jobs]
        link = _link(meta, overhead, rtt, step if variant != "hvd" else 0.0)
        return simulate(jobs, mode, link, pcfg), jobs

    def sim_phase(r):
        return _phase_of([[(s.start, s.end) for s in st[warmup:]] for st in r.steps])

    def at_phase(variant, k, overhead, rtt, step, want, rep=None):
        r, jobs = once(variant, k, overhead, rtt, step, None, rep)
        if want and len(want) == len(jobs):
            # a job's simulated phase is not a simple function of its start offset (the
            # step itself depends on the phase): try _PHASE_GRID offsets over one step for
            # each job in turn and keep the one whose simulated phase is nearest
            period = _med([s.seconds for s in r.steps[0][warmup:]])
            offsets = [j.start for j in jobs]
            for i in range(1, len(jobs)):
                cands = []
                for g in range(_PHASE_GRID):
                    offs = list(offsets)
                    offs[i] = offsets[0] + period * g / _PHASE_GRID
                    rg, jg = once(variant, k, overhead, rtt, step, offs, rep)
                    got = sim_phase(rg)
                    if got:
                        d = abs(((want[i] - got[i] + 0.5) % 1.0) - 0.5)
                        cands.append((d, g, offs, rg, jg))
                if cands:
                    _, _, offsets, r, jobs = min(cands, key=lambda c: (c[0], c[1]))
        stats = _sim_stats(r, jobs, warmup)
        got = sim_phase(r)
        for i, st in enumerate(stats):
            st["phase"] = got[i] if got else None
        return stats

    def over_repeats(variant, k, overhead, rtt, step, rep):
        reps = [at_phase(variant, k, overhead, rtt, step, w, rep)
                for w in phases.get(variant) or [None]]
        return [{"shared": _med([rp[i]["shared"] for rp in reps]),
                 "alone": _med([rp[i]["alone"] for rp in reps]),
                 "comm": _med([rp[i]["comm"] for rp in reps]),
                 "wait": _med([rp[i]["wait"] for rp in reps]),
                 "wait_max": _med([rp[i]["wait_max"] for rp in reps]),
                 "phase": [rp[i]["phase"] for rp in reps]} for i in range(len(reps[0]))]

    def run(variant, k, overhead=0.0, rtt=0.0, step=0.0):
        """Per job: the median over the variant's repeats (each simulated at its own
        testbed phase) of the shared / alone step, and each repeat's simulated phase.
        ``step``: horovod_prio's per-step cost, on every variant but plain Horovod.
        With ``noise`` (:func:`make_noise`): each value is the median over the noise's
        seeded replicas of that, and ``replicas`` / ``replicas_alone`` hold each
        replica's shared / alone step (the phases are the first replica's)."""
        if not noise:
            return over_repeats(variant, k, overhead, rtt, step, None)
        per = [over_repeats(variant, k, overhead, rtt, step, r)
               for r in range(noise["replicas"])]
        return [dict({key: _med([p[i][key] for p in per])
                      for key in ("shared", "alone", "comm", "wait", "wait_max")},
                     phase=per[0][i]["phase"],
                     replicas=[p[i]["shared"] for p in per],
                     replicas_alone=[p[i]["alone"] for p in per]) for i in range(len(per[0]))]
    return run


def _fit_error(run, variant, target, kw, window=None):
    """err(x) = mean simulated - mean measured step of ``variant`` over the jobs
    measured in ``window`` (default: the shared window if the run has one)."""
    def err(x):
        got = run(variant, **kw(x))
        key = window or ("shared" if got[0]["shared"] is not None else "alone")
        pairs = [(g[key], t[key]) for g, t in zip(got, target)
                 if g[key] is not None and t[key] is not None]
        return statistics.fmean(g for g, _ in pairs) - statistics.fmean(t for _, t in pairs)
    return err


def calibrate(alone: dict, profile: Profile, pcfg: PriorityConfig | None = None,
              overhead: float | None = 0.0, measured: dict | None = None,
              comm: dict | None = None, noise: dict | None = None) -> dict:
    """horovod_prio's per-step cost and the arbiter round trip from one job measured
    alone (a ``benchmarks.cluster`` run with one job and the variants hvd, prio, spec),
    after the compute scale on hvd. Each is one number fitted on one variant: the
    model runs prio's step as plain Horovod's (the same fused collectives; nothing
    holds chunks back without an arbiter), so what prio costs beyond hvd alone is a
    per-step cost, and what spec costs beyond prio is the grants' round trip.

    The per-collective overhead is ``overhead`` (paid by every variant), or, if
    None, fitted in turn with the compute scale on the time job 0 had a released
    chunk in flight per step (``spec``'s, else ``prio``'s; :func:`_measured_comm`):
    what its collectives took beyond their bytes on the wire. A rough measure: a
    chunk released on rank 0 also waits there for the other rank to release it,
    which the one-worker model has no place for (prio releases during the
    backward pass and reads far more than spec). Runs recorded before 2026-12-04
    lack the time in flight.

    ``measured`` / ``comm`` (variant -> job 0's time in flight per step): what
    :func:`measured_medians` / :func:`_measured_comm` would read, for runs kept without
    their step series (a ``benchmarks.headline`` folder). ``noise``
    (:func:`make_noise`): every fit on the median over its replicas."""
    meta = alone["meta"]
    if len(meta["jobs"]) != 1:
        raise ValueError("--calibrate: expected a run with one job, got %d" % len(meta["jobs"]))
    measured = measured if measured is not None else measured_medians(alone)
    missing = [v for v in ("hvd", "prio", "spec") if v not in measured]
    if missing:
        raise ValueError("--calibrate: the run lacks variant(s) %s (run it with "
                         "--variants hvd,prio,spec)" % ", ".join(missing))
    if meta["jobs"][0].get("impl") != "arb":
        raise ValueError("--calibrate: the job must be an arb job (its spec variant joins the "
                         "arbiter), got %r" % meta["jobs"][0].get("impl"))
    pcfg = pcfg or PriorityConfig.from_env({}, **_job_env(meta))
    run = _runner(alone, profile, pcfg, noise=noise)
    def fit_k(ov):
        return _bisect(_fit_error(run, "hvd", measured["hvd"],
                                  kw=lambda x: {"k": x, "overhead": ov}), 0.05, 20.0,
                       geometric=True)
    comm = {v: (comm.get(v) if comm is not None else _measured_comm(alone, v))
            for v in ("spec", "prio")}
    comm_v = next((v for v, c in comm.items() if c is not None), None)
    fitted = overhead is None
    if fitted and comm_v is None:
        raise ValueError("--collective-overhead fit: the --calibrate run did not record its "
                         "chunks' time in flight (runs before 2026-12-04 do not)")
    if fitted:
        # the overhead slows plain Horovod's step too (once per fused buffer), so the
        # compute scale and the overhead are fitted in turn until they agree
        target = comm[comm_v]
        overhead = 0.0
        for _ in range(4):
            k = fit_k(overhead)
            overhead = _bisect(lambda x: run(comm_v, k, x)[0]["comm"] - target, 0.0, 0.1)
    k = fit_k(overhead)
    # 0 when prio measured no slower than hvd (a negative cost would be a speed-up the
    # model has no cause for)
    step = _bisect(_fit_error(run, "prio", measured["prio"],
                              kw=lambda x: {"k": k, "overhead": overhead, "step": x}), 0.0, 0.5)
    rtt = _bisect(_fit_error(run, "spec", measured["spec"],
                             kw=lambda x: {"k": k, "overhead": overhead, "step": step,
                                           "rtt": x}), 0.0, 0.2)
    return {"compute_scale": k, "step_cost": step, "arbiter_rtt": rtt,
            "collective_overhead": overhead, "collective_overhead_fitted": fitted,
            "comm_variant": comm_v if fitted else None,
            "comm_measured_s": comm[comm_v] if fitted else None,
            "noise": noise_summary(noise),
            "command": meta.get("command"), "git": meta.get("git"), "date": meta.get("date"),
            "measured": {v: measured[v][0]["alone"] or measured[v][0]["shared"]
                         for v in ("hvd", "prio", "spec")}}


def check(results: dict, profile: Profile, pcfg: PriorityConfig | None = None,
          overhead: float = 0.0, rtt: float = 0.0, compute_scale: float | None = None,
          phase: bool = True, step: float = 0.0, measured: dict | None = None,
          phases: dict | None = None, noise: dict | None = None) -> dict:
    """Every variant of ``results`` in the simulator. The compute scale is fitted on
    plain Horovod unless ``compute_scale`` is given; then every row is a prediction.
    ``phase``: jobs that start together start in the simulator at the relative
    phase they had on the testbed (:func:`phase_fractions`), else 0.5 ms apart.
    ``measured`` / ``phases``: the per-job medians (as :func:`measured_medians`) and the
    repeats' phases (as :func:`_phases`) when ``results["runs"]`` has no step
    series to take them from (a ``benchmarks.headline`` folder keeps only these).
    ``noise`` (:func:`make_noise`): the measured step-to-step variation as compute
    noise in every job, over seeded replicas; each row's ``sim_s`` is then the
    replicas' median (the compute scale fitted on it) and ``sim_replicas`` each
    replica's value. None: the deterministic model."""
    meta = results["meta"]
    pcfg = pcfg or PriorityConfig.from_env({}, **_job_env(meta))
    measured = measured if measured is not None else measured_medians(results)
    if "hvd" not in measured:
        raise ValueError("the run has no plain-Horovod (hvd) variant to fit the compute scale on")
    # fit the compute scale on plain Horovod (bisection: step time grows with k); in a
    # run where a job joins later, on the first job's steps alone (compute and its own
    # communication only: the shared window also depends on how the jobs' phases meet)
    joined = any(float(d.get("start") or 0) > 0 for d in meta["jobs"])
    if not phase or joined:
        phases = {}
    elif phases is None:
        phases = _phases(results)
    run = _runner(results, profile, pcfg, phases, noise)
    fit = compute_scale is None
    k = compute_scale if not fit else _bisect(_fit_error(run, "hvd", measured["hvd"],
                           kw=lambda x: {"k": x, "overhead": overhead},
                           window="alone" if joined else None),
                0.05, 20.0, geometric=True)
    rows, sim_phases, waits = [], {}, []
    mwaits = _measured_waits(results) if results.get("runs") else {}
    for v, meas in measured.items():
        sim = run(v, k, overhead, rtt, step)
        for i, (m, s) in enumerate(zip(mwaits.get(v) or [], sim)):
            if m and s["wait"] is not None:
                waits.append({"variant": v, "job": i, "measured_s": m["wait"],
                              "sim_s": s["wait"], "max_measured_s": m["max"],
                              "max_sim_s": s["wait_max"]})
        if v in phases:
            sim_phases[v] = [s.get("phase") for s in sim]     # per job, per repeat
        for i, (m, s) in enumerate(zip(meas, sim)):
            for key in ("shared", "alone"):
                if m[key] is None or s[key] is None:
                    continue
                row = {"variant": v, "job": i, "window": key, "measured_s": m[key],
                       "sim_s": s[key], "error": s[key] / m[key] - 1.0,
                       "fitted": fit and v == "hvd"}
                if noise:
                    row["sim_replicas"] = s["replicas" if key == "shared" else "replicas_alone"]
                rows.append(row)
    return {"compute_scale": k, "compute_scale_fitted": fit, "phases": phases,
            "sim_phases": sim_phases,
            "collective_overhead": overhead, "arbiter_rtt": rtt, "step_cost": step,
            "noise": noise_summary(noise), "rows": rows, "waits": waits, "command": meta.get("command"),
            "git": meta.get("git"),
            "date": meta.get("date")}


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
    how = ("fitted on plain Horovod" if res.get("compute_scale_fitted", True)
           else "given, not fitted (every row is a prediction)")
    lines = ["Testbed: `%s` (git %s, %s); simulator compute scale %s: "
             "%.2f" % (res["command"], res["git"], res["date"], how, res["compute_scale"]), ""]
    if res.get("phases"):
        def fr(x):
            return "–" if x is None else "%.2f" % x
        parts = []
        for v, reps in res["phases"].items():
            simd = (res.get("sim_phases") or {}).get(v) or []
            for i in range(1, len(reps[0])):
                got = simd[i] if i < len(simd) else []
                parts.append("%s job %d: %s (simulated %s)" % (
                    v, i, " / ".join(fr(rp[i]) for rp in reps),
                    " / ".join(fr(g) for g in got)))
        lines += ["Each repeat is simulated with the jobs at the phase they had on the testbed "
                  "(job i's step starts as a fraction of job 0's step, median over the shared "
                  "window; per repeat): " + "; ".join(parts) + ". A phase the model does not "
                  "hold (it pulls jobs whose compute dominates into lock-step) shows as a "
                  "simulated phase far from the testbed's.", ""]
    cal = res.get("calibration")
    if cal:
        if cal.get("collective_overhead_fitted"):
            ovs = ("; per-collective overhead %.1f ms, fitted in turn with the compute scale "
                   "on %s's time with a chunk in flight (%.0f ms/step)" % (
                       1e3 * cal["collective_overhead"], cal["comm_variant"],
                       1e3 * cal["comm_measured_s"]))
        elif cal.get("collective_overhead"):
            ovs = "; per-collective overhead %.1f ms given" % (1e3 * cal["collective_overhead"])
        else:
            ovs = "; no per-collective overhead"
        lines += ["Job-side costs calibrated on one job alone, `%s` (git %s, %s): compute scale "
                  "%.2f on hvd (%.3f s/step), horovod_prio's per-step cost %.1f ms on prio "
                  "(%.3f s/step), arbiter round trip %.1f ms on spec (%.3f s/step)%s." % (
                      cal["command"], cal["git"], cal["date"], cal["compute_scale"],
                      cal["measured"]["hvd"], 1e3 * cal["step_cost"],
                      cal["measured"]["prio"], 1e3 * cal["arbiter_rtt"],
                      cal["measured"]["spec"], ovs), ""]
    if not cal and (res.get("collective_overhead") or res.get("arbiter_rtt")
                    or res.get("step_cost")):
        lines += ["Job-side costs given: per-collective overhead %.1f ms (every variant), "
                  "horovod_prio's per-step cost %.1f ms, arbiter round trip %.1f ms." % (
                      1e3 * res["collective_overhead"], 1e3 * res.get("step_cost", 0.0),
                      1e3 * res["arbiter_rtt"]), ""]
    sim = res.get("simulated")
    if sim:
        lines += ["Simulated %s at git %s: `python -m benchmarks.sim_check %s`." % (
            sim["date"], sim["git"], " ".join(sim["argv"])), ""]
    nz = res.get("noise")
    if nz:
        lines += ["Compute noise: each job's compute per step stretched by one of %d measured "
                  "step-to-step deviations (sd %.1f ms, 10–90 %% %+.1f to %+.1f ms), drawn per "
                  "step; %d replicas seeded from %d; the simulator column is their median, "
                  "(lo–hi) their range." % (nz["n"], 1e3 * nz["sd_s"], 1e3 * nz["p10_s"],
                                             1e3 * nz["p90_s"], nz["replicas"], nz["seed"]), ""]
    lines += ["| variant | job | window | testbed s/step | simulator s/step | error |",
              "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        reps = [x for x in r.get("sim_replicas") or [] if x is not None]
        lines.append("| %s%s | %d | %s | %.3f | %.3f%s | %+.1f%% |" % (
            r["variant"], " (fitted)" if r["fitted"] else "", r["job"], r["window"],
            r["measured_s"], r["sim_s"],
            " (%.3f–%.3f)" % (min(reps), max(reps)) if reps else "", 100 * r["error"]))
    if res.get("waits"):
        lines += ["", "Arbiter grant waits (request -> grant; testbed: the job's rank-0 trace): "
                  "their union over the job's measured steps per step, and the longest.", "",
                  "| variant | job | testbed wait s/step | simulator wait s/step "
                  "| testbed longest s | simulator longest s |", "|---|---|---|---|---|---|"]
        for w in res["waits"]:
            lines.append("| %s | %d | %.3f | %.3f | %.3f | %.3f |" % (
                w["variant"], w["job"], w["measured_s"], w["sim_s"], w["max_measured_s"],
                w["max_sim_s"]))
    return "\n".join(lines) + "\n"


def _overhead_arg(text: str):
    if text == "fit":
        return None
    try:
        return units.parse_duration_s(text)
    except units.BadValue:
        raise argparse.ArgumentTypeError(
            f"expected a duration >= 0 such as 6ms, or 'fit', got {text!r}") from None


def _load(p, d: Path, what: str) -> dict:
    from . import results_io
    f = d / "results.json(.gz)"
    try:
        f = results_io.results_path(d)
        return results_io.load(f)
    except (OSError, ValueError) as e:
        p.error(f"argument {what}: cannot read {f}: {e}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sim_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="a benchmarks.cluster output folder (results.json.gz)")
    p.add_argument("--profile", required=True,
                   help="profile JSON of the model at the run's batch (benchmarks.profile_model)")
    p.add_argument("--calibrate", metavar="ALONE",
                   help="a benchmarks.cluster folder with one arb job alone and the variants "
                        "hvd,prio,spec: measure horovod_prio's per-step cost and the arbiter "
                        "round trip there")
    p.add_argument("--collective-overhead", type=_overhead_arg, default=0.0, metavar="T|fit",
                   help="per-collective overhead on every variant, plain Horovod's included, "
                        "e.g. 6ms (default 0); 'fit': fitted on --calibrate's time with a "
                        "chunk in flight")
    p.add_argument("--step-cost", type=units.arg(units.parse_duration_s), default=0.0, metavar="T",
                   help="horovod_prio's per-step cost beyond plain Horovod's, on every "
                        "variant but hvd, e.g. 20ms (default 0)")
    p.add_argument("--arbiter-rtt", type=units.arg(units.parse_duration_s), default=0.0, metavar="T",
                   help="job-to-arbiter round trip, e.g. 2ms (default 0)")
    p.add_argument("--compute-scale", metavar="K|calibrated", default=None,
                   help="the compute scale instead of fitting it on DIR's plain Horovod run: a "
                        "number > 0, or 'calibrated' (the one measured on --calibrate's hvd "
                        "run: the same job's compute alone on the same pinning)")
    p.add_argument("--replicas", type=int, default=0, metavar="N",
                   help="with --calibrate: N seeded replicas with ALONE's plain-Horovod "
                        "step-to-step variation as every job's compute noise, each row their "
                        "median (default 0: the deterministic model)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="the replicas' first seed (0)")
    p.add_argument("--no-phase", action="store_true",
                   help="start jobs that start together 0.5 ms apart in the simulator instead "
                        "of at the relative phase they had on the testbed")
    p.add_argument("--no-write", action="store_true",
                   help="print the table only; DIR/sim_check.md and .json stay as they are")
    a = p.parse_args(argv)
    if a.collective_overhead is None and not a.calibrate:
        p.error("argument --collective-overhead: 'fit' needs --calibrate ALONE")
    if a.calibrate and (a.step_cost or a.arbiter_rtt):
        p.error("argument --calibrate: not with --step-cost / --arbiter-rtt "
                "(it measures them)")
    k = a.compute_scale
    if k is not None and k != "calibrated":
        try:
            k = float(k)
        except ValueError:
            k = -1.0
        if not (0 < k < float("inf")):
            p.error(f"argument --compute-scale: expected a number > 0 or 'calibrated', "
                    f"got {a.compute_scale!r}")
    if a.replicas < 0:
        p.error(f"argument --replicas: expected an integer >= 0, got {a.replicas}")
    if a.replicas and not a.calibrate:
        p.error("argument --replicas: needs --calibrate ALONE (its plain-Horovod steps are "
                "the measured variation)")
    if k == "calibrated" and not a.calibrate:
        p.error("argument --compute-scale: 'calibrated' needs --calibrate ALONE")
    d = Path(a.dir)
    results = _load(p, d, "dir")
    try:
        profile = load_profile(a.profile)
    except (OSError, ValueError) as e:
        p.error(f"argument --profile: {e}")
    cal = noise = None
    if a.calibrate:
        alone = _load(p, Path(a.calibrate), "--calibrate")
        noise = make_noise(noise_draws(alone), a.replicas, a.seed)
        if a.replicas and noise is None:
            p.error("argument --replicas: the --calibrate run records no plain-Horovod steps "
                    "to draw the variation from")
        try:
            cal = calibrate(alone, profile, overhead=a.collective_overhead, noise=noise)
        except ValueError as e:
            p.error(str(e))
        a.step_cost, a.arbiter_rtt = cal["step_cost"], cal["arbiter_rtt"]
        a.collective_overhead = cal["collective_overhead"]
        if k == "calibrated":
            k = cal["compute_scale"]
    try:
        res = check(results, profile, overhead=a.collective_overhead, rtt=a.arbiter_rtt,
                    compute_scale=k, phase=not a.no_phase, step=a.step_cost, noise=noise)
    except ValueError as e:
        p.error(f"argument dir: {e}")
    if cal:
        res["calibration"] = cal
    res["simulated"] = {"git": git_rev(), "date": _dt.date.today().isoformat(),
                        "argv": list(argv if argv is not None else sys.argv[1:])}
    md = markdown(res)
    if not a.no_write:
        (d / "sim_check.md").write_text(md)
        (d / "sim_check.json").write_text(json.dumps(res, indent=1))
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
