"""The README's headline table in one command: every headline scenario, each
row beside its bound, the simulator's prediction and the testbed's A/A
resolution.

    sudo .venv/bin/python -m benchmarks.headline               # full matrix (make bench)
    sudo .venv/bin/python -m benchmarks.headline --quick       # a reduced matrix, a few minutes
    python tools/readme_table.py --write --from results/headline/<date>   # (done by a full run)

Runs the scenarios of :data:`SCENARIOS` through the existing runners --
``benchmarks.run`` (one shaped loopback link) and ``benchmarks.cluster`` (the
two-rack testbed) -- by calling their ``parse_args`` / ``plan`` /
``execute_run``: the same jobs, links and cleanup as those commands.
Repeats are interleaved over the whole matrix (repeat 1 of every scenario,
then repeat 2, ...; the scenario order rotates each repeat, each runner
rotates its configurations). The one-job scenario carries an A/A control
(``aa``: plain Horovod again, ``--control``), so every repeat gives an A/A
pair measured in the same sweep: the resolution printed beside the rows.

Per row (:data:`ROWS`): plain Horovod's and horovod_prio's s/step (medians
over repeats), the per-repeat ratios plain / ours and their median, the
bound in seconds and where it comes from (``bound_of``: the link floor, the
overlap ceiling or the job's alone time, arithmetic of ``benchmarks.bounds``),
the share of the bound's gain (``benchmarks.report.bound_cells``) and, for
testbed rows whose model has a measured profile under ``results/sim/``, the
simulator's prediction and its error (``benchmarks.sim_check.check``).

Writes ``OUT/results.json.gz`` (compact: no step series; < 200 KB) and
``OUT/results.md`` and ``OUT/ratios.png`` (each row's ratio beside its bound); a full
matrix with every run ok, written under ``results/headline/``, also regenerates the
README's headline table from it (``--no-readme``: not). OUT defaults to ``results/headline/<UTC date>``
(``--quick``: ``results/headline/quick-<date>``). ``--keep-raw`` also writes
each scenario's full runner results under ``OUT/raw/<scenario>/`` (large: do
not commit). Needs root.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from horovod_prio.method import units

from . import bounds, netns, report, results_io
from .harness import REPO, Progress, check_prio_available, git_rev, positive_int, preflight

FORMAT = "horovod_prio.headline/1"
AA_CONTROL = "aa"
CALIBRATION = "sim-calibration"
#: a calibration run from another sweep applies to a folder only if plain Horovod's step of
#: one job alone agrees within this fraction: the job-side costs are CPU time, and boots of
#: this box measured 0.270 and 0.360 s/step for the same job (the costs 1.5 and 11.1 ms
#: per collective); the A/A spread within a sweep is under 3 %
SAME_BOX = 0.05
#: seeded replicas of the simulator check with the calibration run's measured step-to-step
#: variation as compute noise (sim_check.make_noise; 0: the deterministic model)
SIM_REPLICAS = 16


# ---------------------------------------------------------------- the matrix
@dataclass(frozen=True)
class Scenario:
    key: str                 # short name: work folders, raw output, row references
    runner: str              # "bench" (benchmarks.run) or "cluster" (benchmarks.cluster)
    argv: tuple              # the runner's arguments, without --repeats / --out
    quick_argv: tuple | None = None   # --quick's arguments; None: not in --quick
    est_run_s: float = 30.0  # rough seconds per run on the 2-core box (for the estimate)


SCENARIOS = (
    Scenario("one-job", "bench",
             ("--scenario", "s", "--model", "mlp", "--rates", "1gbit", "--batches", "1024",
              "--impls", f"horovod,prio,{AA_CONTROL}", "--control", AA_CONTROL,
              "--steps", "10", "--warmup", "3"),
             ("--scenario", "s", "--model", "mlp", "--rates", "1gbit", "--batches", "1024",
              "--impls", f"horovod,prio,{AA_CONTROL}", "--control", AA_CONTROL,
              "--steps", "5", "--warmup", "2"), est_run_s=25),
    Scenario("two-jobs", "bench",
             ("--scenario", "c", "--model", "mlp", "--rates", "1gbit", "--batches", "512",
              "--impls", "horovod,prio", "--steps", "10", "--warmup", "3",
              "--stall-timeout", "120"), est_run_s=38),
    Scenario("overlap-mnv2", "bench",
             ("--scenario", "s", "--model", "mobilenetv2", "--rates", "300mbit",
              "--batches", "128,256", "--impls", "horovod,overlap",
              "--variant", "overlap=--overlap", "--inter-threads", "2",
              "--steps", "8", "--warmup", "3"),
             ("--scenario", "s", "--model", "mobilenetv2", "--rates", "300mbit",
              "--batches", "128", "--impls", "horovod,overlap",
              "--variant", "overlap=--overlap", "--inter-threads", "2",
              "--steps", "5", "--warmup", "2"), est_run_s=43),
    Scenario("classes", "cluster",
             ("--job", "arb,class=1,steps=30", "--job", "arb,class=0,start=4,steps=12",
              "--variants", "hvd,spec", "--pin", "job", "--batch", "64"),
             ("--job", "arb,class=1,steps=20", "--job", "arb,class=0,start=3,steps=8",
              "--variants", "hvd,spec", "--pin", "job", "--batch", "64"), est_run_s=30),
    Scenario("join", "cluster",
             ("--job", "arb,steps=30,HOROVOD_PRIO_CALIBRATION_BATCHES=5",
              "--job", "arb,start=4,steps=12,HOROVOD_PRIO_CALIBRATION_BATCHES=5",
              "--variants", "hvd,spec", "--pin", "job", "--batch", "64"), est_run_s=30),
    Scenario("identical-arbiter", "cluster",
             ("--job", "arb,steps=12,HOROVOD_PRIO_CALIBRATION_BATCHES=5",
              "--job", "arb,steps=12,HOROVOD_PRIO_CALIBRATION_BATCHES=5",
              "--variants", "hvd,spec", "--pin", "job", "--rate", "400mbit", "--batch", "320"),
             est_run_s=35),
    # no row of its own: the simulator's job-side costs, measured on one job alone in the
    # same sweep (sim_check.calibrate), for the testbed scenarios on its link, model,
    # batch and pinning (classes, join)
    Scenario(CALIBRATION, "cluster",
             ("--job", "arb,steps=20", "--variants", "hvd,prio,spec", "--pin", "job",
              "--batch", "64"),
             ("--job", "arb,steps=10", "--variants", "hvd,prio,spec", "--pin", "job",
              "--batch", "64"), est_run_s=20),
)


@dataclass(frozen=True)
class Row:
    """One line of the headline table. ``base``/``ours`` pick the runs: a bench
    config (``("horovod",)``) at ``batch``, or a cluster variant; ``job``: a
    cluster job's index (its median in the shared window), None: the mean over
    jobs. ``bound``: "floor", "overlap" or "alone", or None with ``no_bound``
    saying why."""
    title: str
    scenario: str
    base: tuple
    ours: tuple
    batch: int | None = None
    job: int | None = None
    bound: str | None = None
    no_bound: str = ""


ROWS = (
    Row("one job, default settings: MLP, 1 Gbit/s, batch 1024", "one-job",
        ("horovod",), ("prio",), batch=1024, bound="floor"),
    Row("two jobs sharing 1 Gbit/s, no arbiter: MLP, batch 512", "two-jobs",
        ("horovod", "horovod"), ("prio", "prio"), batch=512, bound="floor"),
    Row("`hvd.overlap`: MobileNetV2, 300 Mbit/s, batch 128", "overlap-mnv2",
        ("horovod",), ("overlap",), batch=128, bound="overlap"),
    Row("`hvd.overlap`: MobileNetV2, 300 Mbit/s, batch 256 (compute-bound)", "overlap-mnv2",
        ("horovod",), ("overlap",), batch=256, bound="overlap"),
    Row("job classes, 1 Gbit/s uplink: the class-1 job beside a class-0 job", "classes",
        ("hvd",), ("spec",), job=0, bound="alone"),
    Row("job classes, 1 Gbit/s uplink: the class-0 job (pays for it)", "classes",
        ("hvd",), ("spec",), job=1, no_bound="the class-0 job yields by design: no bound"),
    Row("arbiter + adaptive boost, 1 Gbit/s uplink: job A while B joins", "join",
        ("hvd",), ("spec",), job=0, bound="alone"),
    Row("arbiter + adaptive boost, 1 Gbit/s uplink: the joining job B (pays for it)", "join",
        ("hvd",), ("spec",), job=1, no_bound="the joining job yields by design: no bound"),
    Row("two identical jobs + arbiter, 400 Mbit/s uplink, batch 320", "identical-arbiter",
        ("hvd",), ("spec",), bound="floor"),
)


# ---------------------------------------------------------------- arguments
def build_parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.headline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a reduced matrix (one repeat, fewer scenarios and steps): a few minutes")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="interleaved repeats (default 3; --quick 1)")
    p.add_argument("--only", default=None, metavar="KEY[,KEY...]",
                   help="run only these scenarios (" + ", ".join(s.key for s in SCENARIOS) + ")")
    p.add_argument("--out", default=None,
                   help="result folder (default results/headline/<date>, "
                        "--quick: results/headline/quick-<date>)")
    p.add_argument("--no-readme", action="store_true",
                   help="do not regenerate the README's headline table from a full sweep "
                        "(default: a full matrix with every run ok, written under "
                        "results/headline/, replaces it)")
    p.add_argument("--keep-raw", action="store_true",
                   help="also write every scenario's full runner results to OUT/raw/<key>/")
    p.add_argument("--resim", metavar="DIR", default=None,
                   help="run nothing on the testbed: re-run the simulator check of the headline "
                        "folder DIR from its recorded step medians and print it beside the "
                        "recorded one (no root; writes nothing)")
    p.add_argument("--rebound", metavar="DIR", default=None,
                   help="run nothing on the testbed: recompute the bounds and shares of the "
                        "headline folder DIR from its recorded runs with this checkout's "
                        "bound arithmetic (its simulator check kept as recorded) and rewrite "
                        "DIR/results.json.gz and results.md (no root)")
    p.add_argument("--calibrate", metavar="ALONE", default=None,
                   help="with --resim: a benchmarks.cluster folder of one arb job alone "
                        "(variants hvd,prio,spec) whose job-side costs, measured on its chunks' "
                        "time in flight, go into the scenarios run on the same link, model, "
                        "batch, transport and pinning")
    p.add_argument("--noise-from", metavar="RUN", default=None,
                   help="with --resim: a headline folder or a benchmarks.cluster folder of one "
                        "job alone whose plain-Horovod step-to-step variation is the compute "
                        "noise of the scenarios whose plain Horovod alone it matches within "
                        f"{SAME_BOX:.0%} (for folders recorded without step times)")
    p.add_argument("--replicas", type=_replicas_arg, default=SIM_REPLICAS, metavar="N",
                   help="seeded replicas of the simulator check with the calibration run's "
                        f"measured step-to-step variation as compute noise ({SIM_REPLICAS}; "
                        "0: the deterministic model)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="the replicas' first seed (0)")
    return p


def _replicas_arg(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return n


def parse_args(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    if a.calibrate is not None and a.resim is None:
        p.error("argument --calibrate: only with --resim DIR")
    if a.noise_from is not None and a.resim is None:
        p.error("argument --noise-from: only with --resim DIR")
    if a.rebound is not None and a.resim is not None:
        p.error("argument --rebound: not with --resim")
    if a.repeats is None:
        a.repeats = 1 if a.quick else 3
    known = [s.key for s in SCENARIOS]
    if a.only is not None:
        keys = [k.strip() for k in a.only.split(",") if k.strip()]
        bad = [k for k in keys if k not in known]
        if bad or not keys:
            p.error(f"argument --only: unknown scenario(s) {', '.join(bad) or repr(a.only)} "
                    f"(scenarios: {', '.join(known)})")
        a.only = keys
    if a.out is None:
        day = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
        a.out = str(REPO / "results" / "headline" / (f"quick-{day}" if a.quick else day))
    return a


def selected(args) -> list[Scenario]:
    """The scenarios of this invocation (``--quick``: those with quick arguments)."""
    out = []
    for s in SCENARIOS:
        if args.only is not None and s.key not in args.only:
            continue
        if args.quick and s.quick_argv is None:
            continue
        out.append(s)
    return out


def runner_args(s: Scenario, quick: bool, repeats: int, out: Path):
    """The runner's parsed arguments of scenario ``s`` (its own parser: its
    checks and defaults hold)."""
    argv = list(s.quick_argv if quick else s.argv) + ["--repeats", str(repeats),
                                                      "--out", str(out)]
    if s.runner == "bench":
        from . import run
        return run.parse_args(argv)
    from . import cluster
    return cluster.parse_args(argv)


# ---------------------------------------------------------------- plan
def plan(scens: list[Scenario], plans: dict, repeats: int) -> list[tuple[str, dict]]:
    """(scenario key, runner run) in execution order: repeat by repeat, the
    scenario order rotated each repeat, each scenario's runs of that repeat in
    the runner's own (rotated) order."""
    order = []
    for rep in range(repeats):
        k = rep % len(scens)
        for s in scens[k:] + scens[:k]:
            order += [(s.key, r) for r in plans[s.key] if r["repeat"] == rep]
    return order


def estimate_s(scens: list[Scenario], plans: dict) -> float:
    return sum(s.est_run_s * sum(1 for r in plans[s.key] if not r.get("skip")) for s in scens)


def time_left_s(est: list[float], done: int, elapsed: float) -> float:
    """Seconds left after ``done`` of the runs whose estimates are ``est``: the
    estimates of the rest, scaled by how the finished runs compared to theirs
    (a loaded box runs slower than the estimates)."""
    spent = sum(est[:done])
    return sum(est[done:]) * (elapsed / spent if done and spent > 0 else 1.0)


# ---------------------------------------------------------------- per run: the compact record
def compact(key: str, runner: str, rec: dict) -> dict:
    """What results.json keeps of a runner's run record: which run, its status,
    load, and the step times a row needs (no step series)."""
    out = {"scenario": key, "repeat": rec.get("repeat"), "status": rec.get("status"),
           "error": ((rec.get("error") or "").splitlines() or [""])[0][:200] or None,
           "loadavg_before": rec.get("loadavg_before"), "loadavg_after": rec.get("loadavg_after")}
    if runner == "bench":
        out.update(config=list(rec.get("config") or []), batch=rec.get("batch"),
                   rate=rec.get("rate"))
        if rec.get("status") == "ok":
            st = report.run_stats(rec)
            out.update(s_per_step=st["mean_of_jobs"],
                       job_s=[j["median"] for j in st["jobs"]],
                       job_cpu_s=[j["cpu_median"] for j in st["jobs"]],
                       grad_bytes=(rec["jobs"][0].get("meta") or {}).get("grad_bytes"),
                       ranks=(rec["jobs"][0].get("meta") or {}).get("size", 2), mtu=netns.MTU)
    else:
        out.update(config=[rec.get("variant")], rate=rec.get("rate"))
        if rec.get("status") == "ok":
            st = report.cluster_run_stats(rec)
            from . import testbed
            from .sim_check import phase_fractions, run_comm_s
            out.update(s_per_step=st["mean_shared"],
                       job_s=[j["median_shared"] for j in st["jobs"]],
                       job_alone_s=[j["median_alone"] for j in st["jobs"]],
                       grad_bytes=(rec["jobs"][0].get("meta") or {}).get("grad_bytes"),
                       ranks=2, mtu=testbed.MTU, phase=phase_fractions(rec),
                       comm_s=run_comm_s(rec),
                       # each job's measured steps (seconds, 0.1 ms): the step-to-step
                       # variation the simulator draws its compute noise from
                       job_steps_s=[[round(b - a, 4) for a, b in report.measured_steps(j)]
                                    for j in rec["jobs"]])
    return out


def wall_by_scenario(runs: list[dict]) -> dict:
    """Seconds each scenario's runs took (set-up and clean-up included), in
    the order the scenarios first ran; runs recorded without one are left out."""
    out = {}
    for r in runs:
        if r.get("wall_s") is not None:
            out[r["scenario"]] = out.get(r["scenario"], 0.0) + r["wall_s"]
    return out


# ---------------------------------------------------------------- rows
def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _value(run: dict, row: Row):
    if row.job is None:
        return run.get("s_per_step")
    js = run.get("job_s") or []
    return js[row.job] if row.job < len(js) else None


def _runs_of(runs: list[dict], row: Row, config: tuple) -> list[dict]:
    return [r for r in runs if r["scenario"] == row.scenario and r["status"] == "ok"
            and tuple(r["config"]) == tuple(config)
            and (row.batch is None or r.get("batch") in (None, row.batch))]


def link_mtu(run: dict, runner: str) -> int:
    """The MTU of the run's bottleneck: as recorded, else its runner's (the
    shaped ``lo``'s, ``netns.MTU``; the testbed uplink's, ``testbed.MTU``)."""
    if run.get("mtu") is not None:
        return int(run["mtu"])
    from . import testbed
    return netns.MTU if runner == "bench" else testbed.MTU


def link_floor_s(run: dict, runner: str) -> float | None:
    """The link floor of one run from its measured gradient bytes, in wire
    bytes at its link's MTU (``benchmarks.bounds``): on the loopback link every
    rank's ring traffic crosses the one shaped ``lo``; on the testbed each
    job's ring crosses the uplink once per direction."""
    gb, rate = run.get("grad_bytes"), run.get("rate")
    if not gb or not rate:
        return None
    bps, mtu = units.parse_rate_bits_per_s(rate), link_mtu(run, runner)
    jobs, ranks = len(run["config"]) if runner == "bench" else len(run.get("job_s") or [1]), \
        int(run.get("ranks") or 2)
    if runner == "bench":
        return bounds.link_floor(jobs * ranks * bounds.ring_allreduce_bytes(gb, ranks), bps, mtu)
    return bounds.ring_floor(gb, ranks, bps, jobs, mtu)


def bound_of(row: Row, runner: str, base_runs: list[dict], ours_runs: list[dict]) -> dict:
    """The row's bound: ``{"s", "source"}``, or ``{"s": None, "reason"}``.

    floor   -- the link floor of the baseline's runs;
    overlap -- the overlap ceiling ``max(compute, comm)`` with compute = plain
               Horovod's job CPU s/step (both ranks of the job share one core,
               so their compute adds up; it includes the communication
               threads' CPU) and comm = the link floor (``bounds.overlap_bound``);
               where the model and batch have a measured per-layer profile
               (:func:`layer_profile`), the larger of that and the per-layer
               bound (``bounds.layer_bound``: the same job CPU and link floor,
               split over the layers by the profile);
    alone   -- the job's own median before the other job joined, in our
               variant's runs (the class-1 bound, ``bounds.class1``)."""
    if row.bound is None:
        return {"s": None, "reason": row.no_bound or "no bound for this row"}
    if row.bound == "alone":
        v = _med([(r.get("job_alone_s") or [None] * (row.job + 1))[row.job] for r in ours_runs])
        return ({"s": v, "source": "alone time (the job before the other joined)"} if v else
                {"s": None, "reason": "the job never ran alone in these runs"})
    floor = _med([link_floor_s(r, runner) for r in base_runs])
    if floor is None:
        return {"s": None, "reason": "no gradient size recorded: no link floor"}
    mtus = sorted({link_mtu(r, runner) for r in base_runs})
    unit = bounds.floor_label(mtus[0]) if len(mtus) == 1 else \
        "wire bytes at MTU " + "/".join(map(str, mtus))
    if row.bound == "floor":
        return {"s": floor, "source": f"link floor, {unit}"}
    cpu = _med([_med(r.get("job_cpu_s") or []) for r in base_runs])
    if cpu is None:
        return {"s": None, "reason": "no job CPU s/step recorded: no overlap ceiling"}
    ceiling = bounds.overlap_bound(cpu, 0.0, floor)
    out = {"s": ceiling, "source": f"overlap ceiling max(job CPU s/step, link floor), {unit}"}
    prof = layer_profile(row)
    if prof is not None:
        from horovod_prio.sim.profiles import load_profile
        layers = [(x.params, x.forward_s, x.backward_s) for x in load_profile(str(prof)).layers]
        per_layer = bounds.layer_bound(layers, cpu, floor)
        out.update(overlap_ceiling_s=ceiling, per_layer_s=per_layer)
        if per_layer > ceiling:
            out.update(s=per_layer, source=(
                f"per-layer bound: job CPU s/step and link floor ({unit}) split over the "
                f"layers by the measured profile {prof.relative_to(REPO)}; the overlap "
                f"ceiling max(job CPU, link floor) is {ceiling:.3f}"))
    return out


def layer_profile(row: Row) -> Path | None:
    """The measured per-layer profile of an overlap row's model and batch
    (``results/sim/profile_<model>_b<batch>.json``, ``benchmarks.profile_model``),
    None when there is none: the row's bound is then the overlap ceiling alone."""
    scen = next((x for x in SCENARIOS if x.key == row.scenario), None)
    args = list(scen.argv) if scen is not None else []
    if "--model" not in args or row.batch is None:
        return None
    model = args[args.index("--model") + 1]
    path = REPO / "results" / "sim" / f"profile_{model}_b{row.batch}.json"
    return path if path.is_file() else None


def row_result(row: Row, runner: str, runs: list[dict], sim: dict | None = None) -> dict:
    base_runs, ours_runs = _runs_of(runs, row, row.base), _runs_of(runs, row, row.ours)
    base = {r["repeat"]: _value(r, row) for r in base_runs}
    ours = {r["repeat"]: _value(r, row) for r in ours_runs}
    ratios = [base[k] / ours[k] for k in sorted(base) if k in ours and base[k] and ours[k]]
    out = {"title": row.title, "scenario": row.scenario,
           "base_s": _med(base.values()), "ours_s": _med(ours.values()),
           "ratios": ratios, "ratio": _med(ratios), "repeats": len(ratios)}
    b = bound_of(row, runner, base_runs, ours_runs)
    if not ratios:
        b = {"s": None, "reason": "no repeat with both runs ok"}
    elif b["s"] is not None and out["base_s"] and out["ours_s"]:
        try:
            b["cells"] = list(report.bound_cells(out["base_s"], out["ours_s"], b["s"]))
        except ValueError as e:
            b = {"s": None, "reason": str(e)}
    elif b["s"] is not None:
        b = dict(b, cells=None, reason="no complete repeat")
    out["bound"] = b
    out["sim"] = sim if sim is not None else {
        "reason": "the simulator check reads testbed (benchmarks.cluster) runs only"
        if runner == "bench" else "not checked"}
    return out


def sim_for(row: Row, check_res: dict | None, why: str) -> dict:
    """The simulator's prediction of ``row``'s ours (and base) value from a
    ``sim_check.check`` result of its scenario; ``{"reason"}`` without one."""
    if check_res is None:
        return {"reason": why}
    out = {}
    for side, variant in (("base", row.base[0]), ("ours", row.ours[0])):
        rows = [r for r in check_res["rows"] if r["variant"] == variant and r["window"] == "shared"
                and (row.job is None or r["job"] == row.job)]
        if not rows:
            continue
        meas = statistics.fmean(r["measured_s"] for r in rows)
        simv = statistics.fmean(r["sim_s"] for r in rows)
        out[side] = {"sim_s": simv, "error": simv / meas - 1.0,
                     "fitted": any(r.get("fitted") for r in rows)}
        reps = [r.get("sim_replicas") for r in rows]
        if all(reps):
            # each replica's value of the row (its jobs' mean), their range
            per = [statistics.fmean(x) for x in zip(*reps) if None not in x]
            if per:
                out[side]["replicas"] = [min(per), max(per)]
                # a replica without a step in the window has no value (as a testbed run)
                out[side]["replicas_n"] = [len(per), len(reps[0])]
    if out and "ours" not in out:
        # plain Horovod modelled, horovod_prio not: the job had no step in the window
        out["reason"] = "the simulator gave no step of this job inside the shared window"
    return out or {"reason": "the simulator gave no row for this job"}


def sim_check_scenario(meta: dict, records: list[dict], **kw) -> tuple[dict | None, str]:
    """``sim_check.check`` on a cluster scenario's full records, with the
    measured profile of its model and batch (``results/sim/profile_<model>_b<batch>.json``);
    ``kw`` goes to ``check`` (``measured``/``phases`` for compact records: :func:`resim`)."""
    jobs = meta.get("jobs") or []
    models = {(d.get("model"), d.get("batch")) for d in jobs}
    if len(models) != 1:
        return None, "jobs of different models or batches"
    (model, batch), = models
    prof = REPO / "results" / "sim" / f"profile_{model}_b{batch}.json"
    if not prof.exists():
        return None, f"no measured profile {prof.relative_to(REPO)}"
    from horovod_prio.sim.profiles import load_profile
    from . import sim_check
    try:
        return sim_check.check({"meta": meta, "runs": records}, load_profile(str(prof)), **kw), ""
    except (ValueError, KeyError, ZeroDivisionError) as e:
        return None, f"simulator check failed: {e}"


def calibration_for(meta: dict, alone: dict | None, hvd_alone_s: float | None = None,
                    draws=None, replicas: int = SIM_REPLICAS, seed: int = 0,
                    **kw) -> tuple[dict, str]:
    """The job-side costs (``sim_check.calibrate``, the per-collective overhead
    measured on the chunks' time in flight) of ``alone`` -- a ``benchmarks.cluster``
    run of one arb job with the variants hvd, prio, spec -- for a cluster scenario
    of ``meta`` run on the same link, model, batch, transport and pinning; ``({},
    reason)`` when there is none or it does not match. ``kw`` (``measured``,
    ``comm``) goes to ``calibrate`` for compact runs (:func:`compact_measured`).
    ``hvd_alone_s``: the scenario's plain-Horovod step of one job alone, for a
    calibration run of another sweep: its costs apply only if its own plain-Horovod
    step agrees within :data:`SAME_BOX` (the same box at the same speed).

    The compute noise (``costs["noise"]``, :func:`sim_check.make_noise`): ``draws``
    (seconds), else the step-to-step deviations of ``alone``'s plain-Horovod steps
    where its records have them, over ``replicas`` replicas from ``seed``; the costs
    are then calibrated with it too. None without draws or replicas."""
    if alone is None:
        return {}, "not calibrated: no run of one job alone to measure the job-side costs on"
    am = alone["meta"]
    keys = ("rate", "model", "batch", "transport", "pin")
    diff = [k for k in keys if am.get(k) != meta.get(k)]
    if diff:
        return {}, "not calibrated: the calibration run differs in " + ", ".join(
            f"{k} ({am.get(k)} vs {meta.get(k)})" for k in diff)
    from horovod_prio.sim.profiles import load_profile
    from . import sim_check
    prof = REPO / "results" / "sim" / f"profile_{am['model']}_b{am['batch']}.json"
    if draws is None:
        draws = sim_check.noise_draws(alone)
    try:
        noise = sim_check.make_noise(draws, replicas, seed)
        cal = sim_check.calibrate(alone, load_profile(str(prof)), overhead=None, noise=noise,
                                  **kw)
    except (OSError, ValueError) as e:
        return {}, f"not calibrated: {e}"
    if hvd_alone_s:
        off = cal["measured"]["hvd"] / hvd_alone_s - 1.0
        if abs(off) > SAME_BOX:
            return {}, (f"not calibrated: plain Horovod alone took {cal['measured']['hvd']:.3f} "
                        f"s/step in the calibration run, {off:+.0%} off this run's "
                        f"{hvd_alone_s:.3f} (a box at another speed; its job-side costs "
                        f"apply within {SAME_BOX:.0%})")
    return {"overhead": cal["collective_overhead"], "rtt": cal["arbiter_rtt"],
            "step": cal["step_cost"], "noise": noise}, ""


def sim_summary(sims: dict, why: dict, source: str = "") -> dict:
    """Per checked scenario, what its simulator check ran with: the fitted compute
    scale and the job-side costs, and where the costs came from (``why``: the
    reason they are missing, empty when measured on ``source``, by default the
    sweep's own calibration runs)."""
    source = source or f"the {CALIBRATION} runs of the same sweep (one job alone)"
    out = {}
    for key, (c, reason) in sims.items():
        if c is None:
            out[key] = {"reason": reason}
            continue
        out[key] = {"compute_scale": c["compute_scale"],
                    "collective_overhead_s": c["collective_overhead"],
                    "arbiter_rtt_s": c["arbiter_rtt"], "step_cost_s": c["step_cost"],
                    "costs": why.get(key) or f"measured on {source}"}
        if c.get("noise"):
            out[key]["noise"] = c["noise"]
    return out


def sim_text_of(key: str, e: dict) -> str:
    """One line of :func:`sim_summary`'s entry ``e`` for scenario ``key``."""
    if "reason" in e:
        return f"{key}: no check ({e['reason']})"
    return (f"{key}: compute scale {e['compute_scale']:.2f} (fitted on plain Horovod), "
            f"per-collective overhead {1e3 * e['collective_overhead_s']:.1f} ms, arbiter round "
            f"trip {1e3 * e['arbiter_rtt_s']:.1f} ms, per-step cost {1e3 * e['step_cost_s']:.1f} "
            f"ms: {e['costs']}" + noise_text(e.get("noise")))


def noise_text(nz: dict | None) -> str:
    """The compute noise of a check (:func:`sim_check.noise_summary`), or ""."""
    if not nz:
        return ""
    return (f"; compute noise from {nz['n']} measured step-to-step deviations of plain "
            f"Horovod alone (sd {1e3 * nz['sd_s']:.1f} ms), median of {nz['replicas']} "
            f"seeded replicas (seed {nz['seed']})")


def compact_measured(runs: list[dict], variants) -> tuple[dict, dict, dict]:
    """``(measured, phases, comm)`` of a cluster scenario's compact runs, as
    ``sim_check`` reads them from full records: per variant the per-job medians over
    the repeats (shared and alone), each repeat's phase, job 0's time in flight per
    step (median over the repeats)."""
    measured, phases, comm = {}, {}, {}
    for v in variants:
        vr = [r for r in runs if r["config"] == [v] and r["status"] == "ok"]
        if not vr:
            continue
        n = len(vr[0]["job_s"])
        measured[v] = [{"shared": _med([r["job_s"][i] for r in vr]),
                        "alone": _med([(r.get("job_alone_s") or [None] * n)[i] for r in vr])}
                       for i in range(n)]
        ph = [r["phase"] for r in vr if r.get("phase")]
        if ph:
            phases[v] = ph
        comm[v] = _med([r.get("comm_s") for r in vr])
    return measured, phases, comm


#: the commit that made the arbiter's class reserve 0.875 by default, and its time;
#: sweeps of checkouts without it ran their arbiter without one
CLASS_RESERVE_DEFAULT = ("58ecb74", "2026-12-07T20:52:07+00:00")


def _has_commit(git: str | None, date: str | None, commit: str, when: str) -> bool:
    """Did a sweep of checkout ``git`` (started at ``date``) contain ``commit``? Asked
    of this repository's history; where it does not know ``git``, by the dates."""
    import subprocess
    if git:
        try:
            rc = subprocess.run(["git", "merge-base", "--is-ancestor", commit, git.split("-")[0]],
                                cwd=REPO, capture_output=True, timeout=30).returncode
        except (OSError, subprocess.SubprocessError):
            rc = None
        if rc in (0, 1):
            return rc == 0
    return bool(date) and _dt.datetime.fromisoformat(date) >= _dt.datetime.fromisoformat(when)


def cluster_meta(sc: dict, repeats: int, git: str | None = None,
                 date: str | None = None) -> dict:
    """The ``benchmarks.cluster`` meta of a recorded scenario (``meta["scenarios"]
    [key]``): as the sweep recorded it (``cluster_meta``, sweeps since 2026-12-08), else
    from its arguments through this checkout's runner parser and defaults, with the
    defaults that moved since the sweep's checkout (``git``, started at ``date``) put
    back: the arbiter's class reserve, 0 before :data:`CLASS_RESERVE_DEFAULT`."""
    if sc.get("cluster_meta"):
        return sc["cluster_meta"]
    from . import cluster
    a = cluster.parse_args(list(sc["argv"]) + ["--repeats", str(repeats)])
    meta = cluster.results_meta(a, cluster.variants_to_run(a.job, a.variants),
                                "python -m benchmarks.cluster " + " ".join(sc["argv"]))
    if ((git or date) and a.arbiter_class_reserve is None
            and not _has_commit(git, date, *CLASS_RESERVE_DEFAULT)):
        meta["arbiter_class_reserve"] = 0.0
    return meta


def headline_noise_draws(res: dict) -> tuple:
    """The step-to-step deviations of plain Horovod alone in a headline folder's
    calibration runs (``job_steps_s``, recorded since 2026-12-08); empty before."""
    from . import sim_check
    return sim_check.step_deviations([(r.get("job_steps_s") or [None])[0] for r in res["runs"]
                                      if r["scenario"] == CALIBRATION and r["config"] == ["hvd"]
                                      and r["status"] == "ok"])


def _noise_source(path) -> tuple[tuple, float | None]:
    """(draws, plain Horovod alone s/step) of ``--noise-from``: a headline folder (its
    calibration runs) or a ``benchmarks.cluster`` folder of one job alone (its hvd runs)."""
    from . import sim_check
    rec = results_io.load(results_io.results_path(Path(path)))
    if rec.get("format") == FORMAT:
        cal = [r for r in rec["runs"] if r["scenario"] == CALIBRATION and r["config"] == ["hvd"]
               and r["status"] == "ok"]
        return headline_noise_draws(rec), _med([(r.get("job_alone_s") or [None])[0]
                                                or (r.get("job_s") or [None])[0] for r in cal])
    m = sim_check.measured_medians(rec).get("hvd") or [{}]
    return sim_check.noise_draws(rec), m[0].get("alone") or m[0].get("shared")


def resim(folder, calibrate=None, noise_from=None, replicas: int = SIM_REPLICAS,
          seed: int = 0) -> dict:
    """The simulator's check of a headline folder's testbed rows again, from what
    the folder recorded (no testbed, no root): each cluster scenario's runner meta
    rebuilt from its recorded arguments (the runner's parser and defaults of this
    checkout), the per-job step medians of its compact runs, and the phases the runs
    recorded (folders made before runs recorded their phase simulate the jobs that
    start together 0.5 ms apart, not at the testbed's phase). ``calibrate``: a
    ``benchmarks.cluster`` folder of one arb job alone (:func:`calibration_for`)
    whose job-side costs go into the scenarios it matches. The compute noise
    (``replicas`` seeded from ``seed``; 0: the deterministic model) comes from the
    calibration run's plain-Horovod steps where recorded, or from ``noise_from`` (a
    headline or one-job cluster folder), which lends them only to a scenario whose
    plain Horovod alone it matches within :data:`SAME_BOX`. Returns ``{"rows":
    [{"title", "measured_s", "recorded": sim or None, "now": sim}], "notes": [...]}``
    (a sim: ``{"sim_s", "error"}`` or ``{"reason"}``)."""
    res = results_io.load(results_io.results_path(Path(folder)))
    m = res["meta"]
    cal_kw = {}
    if calibrate is not None:
        alone = results_io.load(results_io.results_path(Path(calibrate)))
    elif CALIBRATION in m["scenarios"]:
        sc = m["scenarios"][CALIBRATION]
        meta = cluster_meta(sc, m["repeats"], m.get("git"), m.get("date"))
        measured, _, comm = compact_measured(
            [r for r in res["runs"] if r["scenario"] == CALIBRATION], meta["variants"])
        alone, cal_kw = {"meta": meta, "runs": []}, {"measured": measured, "comm": comm,
                                                     "draws": headline_noise_draws(res)}
    else:
        alone = None
    lent, lent_hvd = (None, None) if noise_from is None else _noise_source(noise_from)
    checks, notes, why = {}, [], {}
    for key, sc in m["scenarios"].items():
        if sc["runner"] != "cluster" or key == CALIBRATION:
            continue
        meta = cluster_meta(sc, m["repeats"], m.get("git"), m.get("date"))
        measured, phases, _ = compact_measured(
            [r for r in res["runs"] if r["scenario"] == key], meta["variants"])
        together = all(float(d.get("start") or 0) == 0 for d in meta["jobs"])
        if together and len(meta["jobs"]) > 1 and not phases:
            notes.append(f"{key}: no phases recorded; its jobs are simulated 0.5 ms apart")
        # another sweep's calibration run: only on a box at the same speed (job 0 alone)
        hvd0 = ((measured.get("hvd") or [{}])[0].get("alone") if calibrate is not None
                else None)
        kw = dict(cal_kw)
        if lent is not None:
            own = (measured.get("hvd") or [{}])[0].get("alone")
            off = lent_hvd / own - 1.0 if lent_hvd and own else None
            if off is not None and abs(off) <= SAME_BOX and lent:
                kw["draws"] = lent
                notes.append(f"{key}: compute noise from {noise_from} (plain Horovod alone "
                             f"{lent_hvd:.3f} s/step there, {off:+.0%} off this run's)")
            else:
                kw["draws"] = ()
                notes.append(f"{key}: no compute noise from {noise_from}: " + (
                    "it records no step times" if not lent else
                    f"plain Horovod alone took {lent_hvd:.3f} s/step there, "
                    f"{off:+.0%} off this run's {own:.3f}" if off is not None else
                    "no plain-Horovod step alone to compare"))
        costs, why[key] = calibration_for(meta, alone, hvd_alone_s=hvd0, replicas=replicas,
                                          seed=seed, **kw)
        checks[key] = sim_check_scenario(meta, [], measured=measured, phases=phases, **costs)
    rows = []
    recorded = {r["title"]: r.get("sim") or {} for r in res.get("rows") or []}
    for row in ROWS:
        if row.scenario not in checks:
            continue
        now = sim_for(row, *checks[row.scenario])
        rec = recorded.get(row.title) or {}
        meas = [r for r in res.get("rows") or [] if r["title"] == row.title]
        rows.append({"title": row.title, "measured_s": meas[0]["ours_s"] if meas else None,
                     "recorded": rec.get("ours"), "now": now.get("ours") or now})
    return {"folder": str(folder), "git": git_rev(), "rows": rows, "notes": notes,
            "calibration": None if calibrate is None else str(calibrate),
            "noise_from": None if noise_from is None else str(noise_from),
            "replicas": replicas, "seed": seed,
            "checks": {k: c for k, (c, _) in checks.items()},
            "sim": sim_summary(checks, why, f"{calibrate} (one job alone)" if calibrate else "")}


def resim_markdown(r: dict) -> str:
    def cell(s):
        if not s:
            return "–"
        if "sim_s" not in s:
            return f"– ({s.get('reason', 'none')})"
        return (f"{s['sim_s']:.3f} ({s['error']:+.0%})"
                + (" [replicas %.3f–%.3f%s]" % (*s["replicas"], "" if s.get(
                    "replicas_n", [0, 0])[0] == s.get("replicas_n", [0, 0])[1]
                    else ", %d of %d with a value" % tuple(s["replicas_n"]))
                   if s.get("replicas") else ""))
    cal = f" --calibrate {r['calibration']}" if r.get("calibration") else ""
    cal += f" --noise-from {r['noise_from']}" if r.get("noise_from") else ""
    if r.get("replicas", SIM_REPLICAS) != SIM_REPLICAS:
        cal += f" --replicas {r['replicas']}"
    if r.get("seed"):
        cal += f" --seed {r['seed']}"
    lines = [f"Simulator check of `{r['folder']}` re-run at git {r['git']} from its recorded "
             f"medians (`python -m benchmarks.headline --resim {r['folder']}{cal}`)", "",
             "| scenario | horovod_prio s/step (testbed) | simulator as recorded (error) "
             "| simulator now (error) |", "|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['title']} | {_f(row['measured_s'])} | {cell(row['recorded'])} "
                     f"| {cell(row['now'])} |")
    lines += [""] + [f"- {n}" for n in r["notes"]]
    lines += [f"- {sim_text_of(k, e)}" for k, e in r["sim"].items()]
    return "\n".join(lines) + "\n"


def aa_pairs(runs: list[dict]) -> list[tuple[float, float]]:
    """(plain Horovod, its A/A control) per repeat of the one-job scenario."""
    by = {}
    for r in runs:
        if r["scenario"] == "one-job" and r["status"] == "ok" and r.get("s_per_step"):
            by.setdefault(r["repeat"], {})[tuple(r["config"])] = r["s_per_step"]
    return [(v[("horovod",)], v[(AA_CONTROL,)]) for _, v in sorted(by.items())
            if ("horovod",) in v and (AA_CONTROL,) in v]


# ---------------------------------------------------------------- output
def _f(x, spec="{:.3f}"):
    return "–" if x is None else spec.format(x)


def ratio_text(row: dict) -> str:
    if row.get("ratio") is None:
        return "–"
    rs = row["ratios"]
    return f"{row['ratio']:.2f}×" + (f" ({min(rs):.2f}–{max(rs):.2f})" if len(rs) > 1 else "")


def share_text(row: dict) -> str:
    """The share of the bound's gain, or "–" and the reason there is none."""
    b = row["bound"]
    if b.get("s") is None or not b.get("cells"):
        return f"– ({b.get('reason', 'no bound')})"
    return b["cells"][1]


def sim_text(row: dict) -> str:
    s = row.get("sim") or {}
    if "ours" not in s:
        return f"– ({s.get('reason', 'not checked')})"
    return f"{s['ours']['sim_s']:.3f} ({s['ours']['error']:+.0%})"


def markdown(res: dict) -> str:
    from . import testbed
    m = res["meta"]
    lines = [f"Command: `{m['command']}` — {m['date']}, git {m['git']}, "
             f"{m['machine']['ncpu']} cores, repeats={m['repeats']}"
             + (", quick" if m.get("quick") else ""), "",
             "| scenario | plain Horovod s/step | horovod_prio s/step | ratio | bound s/step "
             "| share of the bound | simulator s/step (error) |",
             "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        b = r["bound"]
        bound = f"{b['s']:.3f} ({b['source']})" if b.get("s") is not None else "–"
        lines.append(f"| {r['title']} | {_f(r['base_s'])} | {_f(r['ours_s'])} | {ratio_text(r)} "
                     f"| {bound} | {share_text(r)} | {sim_text(r)} |")
    lines += ["", "Link floor: the bytes that must cross the bottleneck counted as its `tc tbf` "
              "shaper counts them, whole TCP/IPv4 frames over Ethernet (MTU + 14 bytes on the "
              "wire per MTU − 52 of payload: 1514 per 1448 at MTU 1500), ÷ its rate, at the "
              f"MTU of each row's link ({netns.MTU} on the shaped loopback, {testbed.MTU} on "
              "the testbed's uplink)."]
    if m.get("rebound"):
        lines += ["", f"Bounds and shares re-rendered at git {m['rebound']['git']} from the "
                      f"recorded runs ({m['rebound']['what']})"
                  + ("; kept as recorded, not rows of that checkout: "
                     + "; ".join(m["rebound"]["kept"]) if m["rebound"].get("kept") else "")
                  + "."]
    if res.get("sim"):
        lines += ["", "Simulator: " + "; ".join(sim_text_of(k, e) for k, e in res["sim"].items())
                  + "."]
    walls = wall_by_scenario(res["runs"])
    if walls:
        lines += ["", "Wall time: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in walls.items())
                  + f"; {sum(walls.values()) / 60:.1f} min in all."]
    lines += ["", res["aa"]["text"], "",
              f"1-min load average at start {m['loadavg_start']:.1f}, end "
              f"{_f(m.get('loadavg_end'), '{:.1f}')}; runs ok "
              f"{sum(r['status'] == 'ok' for r in res['runs'])}/{len(res['runs'])}"]
    failed = [r for r in res["runs"] if r["status"] != "ok"]
    for r in failed[:10]:
        lines.append(f"- failed: {r['scenario']} {'+'.join(r['config'])} repeat "
                     f"{(r['repeat'] or 0) + 1}: {r['error']}")
    return "\n".join(lines) + "\n"


def planned(row: Row, scenarios: dict) -> bool:
    """Does the invocation (``meta["scenarios"]``: key -> its runner's argv) run
    this row's scenario, at this row's batch?"""
    sc = scenarios.get(row.scenario)
    if sc is None:
        return False
    argv = sc["argv"]
    if row.batch is None or "--batches" not in argv:
        return True
    return str(row.batch) in argv[argv.index("--batches") + 1].split(",")


def summarize(res: dict, scens: list[Scenario], sims: dict) -> None:
    """Fill ``res["rows"]`` and ``res["aa"]`` from ``res["runs"]``."""
    runner = {s.key: s.runner for s in scens}
    res["rows"] = []
    for row in ROWS:
        if row.scenario not in runner or not planned(row, res["meta"]["scenarios"]):
            continue
        sim = None
        if runner[row.scenario] == "cluster":
            sim = sim_for(row, *sims.get(row.scenario, (None, "not checked")))
        res["rows"].append(row_result(row, runner[row.scenario], res["runs"], sim))
    pairs = aa_pairs(res["runs"])
    if pairs:
        r = bounds.aa_resolution(pairs)
        res["aa"] = {"pairs": [list(p) for p in pairs], "median": r.median, "max": r.max,
                     "cv": r.cv, "text": r.text() + " (one job, plain Horovod against itself, "
                                                    "same sweep)"}
    else:
        res["aa"] = {"pairs": [], "text": "A/A resolution: no complete pair"}


#: what a re-render of a folder's bounds (:func:`rebound`) computes anew
REBOUND_WHAT = ("link floor in wire bytes at each link's MTU; overlap rows: the per-layer "
                "bound where results/sim/ holds the model's profile at the row's batch")


def rebound(folder) -> dict:
    """A headline folder's results with every row's bound and share recomputed
    from its recorded runs by this checkout's :func:`row_result` (the bound
    arithmetic of ``benchmarks.bounds``), each row's simulator check kept as
    recorded; the re-render is noted in ``meta["rebound"]``. Rows are matched by
    title: a recorded row this checkout no longer has stays as recorded, and
    ``meta["rebound"]["kept"]`` names it."""
    res = results_io.load(results_io.results_path(Path(folder)))
    if res.get("format") != FORMAT:
        raise ValueError(f"not a benchmarks.headline result (format {res.get('format')!r})")
    runner = {k: v["runner"] for k, v in res["meta"]["scenarios"].items()}
    by_title = {r.title: r for r in ROWS}
    rows, kept = [], []
    for old in res["rows"]:
        row = by_title.get(old["title"])
        if row is None:
            rows.append(old)
            kept.append(old["title"])
            continue
        rows.append(row_result(row, runner[row.scenario], res["runs"], old.get("sim")))
    res["rows"] = rows
    res["meta"]["rebound"] = {"git": git_rev(),
                              "what": REBOUND_WHAT, "kept": kept}
    return res


PLOT = "ratios.png"


def plot_points(res: dict) -> list[tuple]:
    """What :func:`plot_rows` draws, per row with a ratio: (title, median ratio plain / ours,
    the repeats' lowest and highest ratio, the best ratio the row's bound allows -- plain
    Horovod's s/step / the bound's s/step -- or None where the row has no bound)."""
    pts = []
    for r in res["rows"]:
        if r.get("ratio") is None:
            continue
        b = r["bound"]
        best = r["base_s"] / b["s"] if b.get("s") and r.get("base_s") else None
        pts.append((r["title"], r["ratio"], min(r["ratios"]), max(r["ratios"]), best))
    return pts


def plot_rows(res: dict, path: Path) -> Path | None:
    """One bar per row with a ratio (:func:`plot_points`): the median ratio, a line over
    the repeats' range and a black tick at the bound's ratio. None if no row has a ratio."""
    pts = plot_points(res)
    if not pts:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import textwrap

    fig, ax = plt.subplots(figsize=(10, 0.45 * len(pts) + 1.2), dpi=80)
    ys = list(range(len(pts)))[::-1]
    for y, (_, ratio, lo, hi, best) in zip(ys, pts):
        ax.barh(y, ratio, color="tab:blue" if ratio >= 1 else "tab:orange", height=0.6)
        ax.plot([lo, hi], [y, y], color="0.2", lw=1)
        if best is not None:
            ax.plot([best], [y], "|", color="k", ms=14, mew=2)
    ax.axvline(1.0, color="0.5", lw=1, ls="--")
    ax.set_yticks(ys)
    ax.set_yticklabels([textwrap.shorten(p[0].replace("`", ""), 75, placeholder="…")
                        for p in pts], fontsize=7)
    ax.set_xlabel("plain Horovod s/step ÷ horovod_prio s/step: bar = median, line = the "
                  "repeats, tick = the bound", fontsize=8)
    m = res["meta"]
    ax.set_title(f"{m['date'][:10]}, git {m['git']}, repeats={m['repeats']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write(res: dict, out: Path, plot: bool = False) -> None:
    """``results.json.gz`` and ``results.md``; ``plot``: also :data:`PLOT` (the rows' ratios
    beside their bounds)."""
    out.mkdir(parents=True, exist_ok=True)
    results_io.save(out, res, raw=False)
    (out / "results.md").write_text(markdown(res))
    if plot:
        plot_rows(res, out / PLOT)


def update_readme(res: dict, out: Path, readme: Path | None = None, repo: Path = REPO) -> str:
    """Regenerate the README's headline table (and its plot line) from ``out``, the way
    ``python tools/readme_table.py --write --from OUT`` does, where the sweep may stand for
    the README: a full matrix (not ``--quick``, not ``--only``), every run ok, written under
    this repository's ``results/headline/``. Returns what was done or why not."""
    if res["meta"].get("quick") or res["meta"].get("only"):
        return "README not updated: a partial matrix (--quick/--only)"
    if any(r["status"] != "ok" for r in res["runs"]) or res["meta"].get("interrupted"):
        return "README not updated: not every run ended ok"
    try:
        rel = out.resolve().relative_to(repo.resolve())
    except ValueError:
        return f"README not updated: {out} is not inside {repo}"
    if rel.parent != Path("results/headline"):
        return f"README not updated: {rel} is not a folder of results/headline/"
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import readme_table
    finally:
        sys.path.pop(0)
    readme = readme or readme_table.README
    text = readme.read_text()
    tab = readme_table.table(source=str(rel), repo=repo)
    readme.write_text(readme_table.render(text, tab, str(rel)))
    return f"README's headline table regenerated from {rel}"


def machine() -> dict:
    return {"ncpu": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "node": platform.node()}


# ---------------------------------------------------------------- main
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rebound is not None:
        try:
            res = rebound(args.rebound)
        except (OSError, ValueError, KeyError) as e:
            sys.stderr.write(f"python -m benchmarks.headline: error: argument --rebound: "
                             f"cannot re-render {args.rebound}: {e}\n")
            return 2
        write(res, Path(args.rebound), plot=True)
        sys.stdout.write(markdown(res))
        return 0
    if args.resim is not None:
        try:
            sys.stdout.write(resim_markdown(resim(args.resim, args.calibrate, args.noise_from,
                                                    args.replicas, args.seed)))
        except (OSError, ValueError, KeyError) as e:
            sys.stderr.write(f"python -m benchmarks.headline: error: argument --resim: "
                             f"cannot re-check {args.resim}: {e}\n")
            return 2
        return 0
    if not preflight("headline"):
        return 2
    from . import cgroups, cluster, run, testbed
    netns.cleanup_stale()
    testbed.cleanup_stale()
    cgroups.cleanup_stale()
    ok, why = check_prio_available()
    if not ok:
        sys.stderr.write(f"[headline] error: horovod_prio binding unavailable ({why})\n")
        return 2
    out = Path(args.out)
    scens = selected(args)
    workroot = Path(tempfile.mkdtemp(prefix="hprio-headline-"))
    secret_file = workroot / "secret"
    secret_file.write_text(secrets.token_urlsafe(32))
    os.chmod(secret_file, 0o600)
    sargs, plans, raw = {}, {}, {}
    for s in scens:
        a = runner_args(s, args.quick, args.repeats, workroot / "unused" / s.key)
        sargs[s.key] = a
        if s.runner == "bench":
            plans[s.key] = run.plan(a, True)
            raw[s.key] = {"meta": run.results_meta(a, True, "", "python -m benchmarks.run "
                                                   + " ".join(s.argv)), "runs": []}
        else:
            variants = cluster.variants_to_run(a.job, a.variants)
            plans[s.key] = cluster.plan(variants, args.repeats)
            raw[s.key] = {"meta": cluster.results_meta(a, variants, "python -m benchmarks.cluster "
                                                       + " ".join(s.argv)), "runs": []}
    order = [(k, r) for k, r in plan(scens, plans, args.repeats) if not r.get("skip")]
    command = "python -m benchmarks.headline " + " ".join(sys.argv[1:] if argv is None else argv)
    res = {"format": FORMAT, "meta": {
        "command": command, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git": git_rev(), "machine": machine(), "loadavg_start": os.getloadavg()[0],
        "loadavg_end": None, "repeats": args.repeats, "quick": args.quick,
        "only": args.only,
        "scenarios": {s.key: dict({"runner": s.runner,
                                   "argv": list(s.quick_argv if args.quick else s.argv)},
                                  # the runner's settings as this checkout ran them (its
                                  # defaults move: --resim rebuilds from this, not today's)
                                  **({"cluster_meta": raw[s.key]["meta"]}
                                     if s.runner == "cluster" else {}))
                      for s in scens},
        "estimate_s": estimate_s(scens, plans)}, "runs": [], "rows": [], "aa": {}}
    sys.stderr.write(f"[headline] {len(order)} runs in {len(scens)} scenarios x {args.repeats} "
                     f"repeat(s), about {res['meta']['estimate_s'] / 60:.0f} min; writing {out}\n")
    progress = Progress(len(order), tag="headline")
    by_key = {s.key: s for s in scens}
    est = [by_key[k].est_run_s for k, _ in order]
    t0 = time.monotonic()
    code = 0
    try:
        for i, (key, r) in enumerate(order):
            s, a = by_key[key], sargs[key]
            left = time_left_s(est, i, time.monotonic() - t0)
            progress.start(f"{key}: {'+'.join(r.get('config') or [r.get('variant', '?')])}"
                           f"{' b' + str(r['batch']) if r.get('batch') else ''} "
                           f"(repeat {r['repeat'] + 1}/{args.repeats}; "
                           f"{time.monotonic() - t0:.0f}s elapsed, ~{left / 60:.0f} min left)")
            t_run = time.monotonic()
            if s.runner == "bench":
                rec = run.execute_run(r, a, workroot / key, progress)
            else:
                rec = cluster.execute_run(r, a, workroot / key, secret_file, progress)
            raw[key]["runs"].append(rec)
            res["runs"].append(dict(compact(key, s.runner, rec),
                                    wall_s=time.monotonic() - t_run))
            progress.finish(rec["status"] + ("" if rec["status"] == "ok" else
                                             ": " + (rec.get("error") or "").splitlines()[0][:100]))
            summarize(res, scens, {})
            write(res, out)
    except (KeyboardInterrupt, SystemExit):
        res["meta"]["interrupted"] = True
        sys.stderr.write("\n[headline] interrupted; cleaned up, partial results kept\n")
        code = 130
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
    sims, why = {}, {}
    alone = raw.get(CALIBRATION)
    for s in scens:
        if s.runner == "cluster" and s.key != CALIBRATION:
            # the noise from the compact runs' step times, as --resim reads them
            costs, why[s.key] = calibration_for(raw[s.key]["meta"], alone,
                                                draws=headline_noise_draws(res),
                                                replicas=args.replicas, seed=args.seed)
            if why[s.key]:
                sys.stderr.write(f"[headline] simulator check of {s.key}: {why[s.key]}\n")
            sims[s.key] = sim_check_scenario(raw[s.key]["meta"], raw[s.key]["runs"], **costs)
    res["sim"] = sim_summary(sims, why)
    res["meta"]["loadavg_end"] = os.getloadavg()[0]
    summarize(res, scens, sims)
    write(res, out, plot=True)
    if not args.no_readme:
        sys.stderr.write(f"[headline] {update_readme(res, out)}\n")
    if args.keep_raw:
        for key, data in raw.items():
            results_io.save(out / "raw" / key, data)
    sys.stdout.write(markdown(res))
    sys.stderr.write(f"[headline] wrote {out}/results.json.gz, results.md\n")
    if code:
        return code
    return 1 if any(r["status"] != "ok" for r in res["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
