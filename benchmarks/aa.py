"""A/A probe: how far two runs of identical plain Horovod differ on this box.

    sudo .venv/bin/python -m benchmarks.aa --pairs 5 --rate 1gbit --batch 256
    sudo .venv/bin/python -m benchmarks.aa --pairs 5 --pin rank --threads 2 \\
        --rank-cgroup custom,cpu=0.45,period=10ms

Runs one 2-rank plain-Horovod job (``benchmarks.workload``, both ranks in one
network namespace whose ``lo`` is shaped, as ``benchmarks.run``) as A and as
A' -- the same command -- in N pairs. Which of the two runs first is drawn per
pair (``--seed``), half the pairs each way, so neither the label nor a fixed
pattern such as A A' A' A lines up with the run's position; one unmeasured
run first (``--warmup-runs``) pays the cold start (page cache, imports) that
would otherwise land on the first pair. Every run works in a folder named by
its position only (``run03``), never by its label. Each run's value is its
median s/step over the measured steps. Printed: every pair and the spread,
``benchmarks.bounds.aa_resolution``: the median and maximum of |A' - A| / A
over the pairs and the coefficient of variation of all runs, and beside it
the order effect (second run of a pair against the first, ``order_effect``):
a label effect with no order effect, or the reverse, says which one the box
has. A difference between two variants measured the same way means
something only beyond that spread.

Options that may narrow it: ``--threads``/``--inter-threads`` (TF threads per
rank), ``--pin`` (job: both ranks on core 0; rank: rank r on core r; none),
``--rank-cgroup KIND[,key=value...]`` (each rank in a cgroup of its own with
these limits, see ``benchmarks.cgroups``: e.g. ``custom,cpu=0.45,period=10ms``
caps each rank at 0.45 core). Results: ``OUT/results.json.gz`` (default
``results/bench/aa/latest``). Needs root (namespaces, tc, cgroups).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from . import cgroups, netns, results_io
from .bounds import aa_resolution
from .harness import (REPO, JobSpec, Progress, RunFailed, git_rev, job_command, positive_int,
                      preflight, rate_arg, workload_command)
from .models import HARNESS_MODELS

LABELS = ("A", "A'")


# ---------------------------------------------------------------- arguments
def _rank_cgroup(text):
    try:
        return cgroups.parse_kind(text, what=f"rank cgroup {text!r}")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.aa", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=positive_int, default=5, help="A/A' pairs (default 5)")
    p.add_argument("--rate", type=rate_arg, default="1gbit", help="tc tbf rate of lo")
    p.add_argument("--model", choices=HARNESS_MODELS, default="mlp")
    p.add_argument("--batch", type=positive_int, default=256, help="per-rank batch")
    p.add_argument("--steps", type=positive_int, default=20, help="measured steps per run")
    p.add_argument("--warmup", type=positive_int, default=3)
    p.add_argument("--threads", type=positive_int, default=1, help="TF threads per rank")
    p.add_argument("--inter-threads", type=positive_int, default=None,
                   help="TF inter-op threads per rank (default: --threads)")
    p.add_argument("--pin", choices=["job", "rank", "none"], default="none",
                   help="job: both ranks on core 0; rank: rank r on core r; none (default)")
    p.add_argument("--rank-cgroup", type=_rank_cgroup, default=None,
                   metavar="KIND[,key=value...]",
                   help="each rank in a cgroup of its own (kinds and keys: docs/testbed.md)")
    p.add_argument("--seed", type=int, default=0,
                   help="draws which run of each pair goes first (recorded; default 0)")
    p.add_argument("--warmup-runs", type=int, default=1,
                   help="unmeasured runs before the first pair (default 1; 0: none)")
    p.add_argument("--pair-warmup", type=int, default=0,
                   help="unmeasured runs before each pair (default 0): the first run of a "
                        "pair then follows a run just as the second does")
    p.add_argument("--job-timeout", type=positive_int, default=600, help="seconds per run")
    p.add_argument("--stall-timeout", type=positive_int, default=60)
    p.add_argument("--out", default=str(REPO / "results" / "bench" / "aa" / "latest"))
    return p


def parse_args(argv=None):
    a = build_parser().parse_args(argv)
    if a.warmup_runs < 0:
        build_parser().error(f"argument --warmup-runs: expected an integer >= 0, "
                             f"got {a.warmup_runs}")
    if a.pair_warmup < 0:
        build_parser().error(f"argument --pair-warmup: expected an integer >= 0, "
                             f"got {a.pair_warmup}")
    if a.rank_cgroup is not None and a.pin == "rank" and a.rank_cgroup[1].cpuset is not None:
        build_parser().error("argument --rank-cgroup: cpuset and --pin rank both place the "
                             "ranks; give one")
    return a


# ---------------------------------------------------------------- plan and statistics
def plan(pairs: int, seed: int = 0, warmup_runs: int = 0, pair_warmup: int = 0) -> list[dict]:
    """The runs in order: ``warmup_runs`` unmeasured runs (pair None), then the
    pairs, each after ``pair_warmup`` unmeasured runs of its own (pair None),
    so that both runs of a pair follow a run of the same command. Half of the pairs (the extra one of an odd count by the draw) run A
    first, the others A' first, which ones drawn with ``seed``; ``first`` is the
    label that ran first. ``dir`` names the run's work folder by its position
    only: a label never reaches a path."""
    rng = random.Random(seed)
    a_first = [True] * (pairs // 2) + [False] * (pairs // 2)
    if pairs % 2:
        a_first.append(rng.random() < 0.5)
    rng.shuffle(a_first)
    runs = [{"pair": None, "label": "warm-up", "first": None} for _ in range(warmup_runs)]
    for i, af in enumerate(a_first):
        order = LABELS if af else LABELS[::-1]
        runs += [{"pair": None, "label": "warm-up", "first": None} for _ in range(pair_warmup)]
        runs += [{"pair": i, "label": label, "first": order[0]} for label in order]
    for n, r in enumerate(runs):
        r["dir"] = f"run{n:02d}"
    return runs


def step_time(job: dict) -> float | None:
    """A run's value: the median s/step of its measured steps."""
    from .report import measured_steps
    d = [b - a for a, b in measured_steps(job)]
    return statistics.median(d) if d else None


def pair_values(records: list[dict]) -> list[tuple[float, float]]:
    """(A, A') per pair whose two runs both succeeded, in pair order."""
    by = {}
    for r in records:
        if r.get("pair") is not None and r.get("status") == "ok" and r.get("s_per_step"):
            by.setdefault(r["pair"], {})[r["label"]] = r["s_per_step"]
    return [(v["A"], v["A'"]) for _, v in sorted(by.items()) if set(v) == set(LABELS)]


def order_effect(records: list[dict]) -> dict | None:
    """The second run of each complete pair against its first, whatever their
    labels: ``{"pairs", "diffs" ((second - first) / first per pair), "median",
    "second_slower" (pairs where the second run was slower)}``; None without a
    complete pair. A fixed cost of running second (page cache, a process or
    port left by the run before) shows here and cancels out of the A/A
    resolution, where the orders are balanced."""
    by = {}
    for r in records:
        if r.get("pair") is not None and r.get("status") == "ok" and r.get("s_per_step"):
            by.setdefault(r["pair"], []).append(r)
    diffs = []
    for _, rs in sorted(by.items()):
        if len(rs) == 2:
            # the label that ran first as planned; records are in run order otherwise
            first, second = rs[::-1] if rs[1]["label"] == rs[1].get("first") else rs
            diffs.append((second["s_per_step"] - first["s_per_step"]) / first["s_per_step"])
    if not diffs:
        return None
    return {"pairs": len(diffs), "diffs": diffs, "median": statistics.median(diffs),
            "second_slower": sum(d > 0 for d in diffs)}


def order_line(records: list[dict]) -> str:
    o = order_effect(records)
    if o is None:
        return "order effect: no complete pair"
    return (f"order effect (second run of a pair vs the first) over {o['pairs']} pair(s): "
            f"median {o['median']:+.1%}, second slower in {o['second_slower']}/{o['pairs']}")


def summary(records: list[dict]) -> str:
    """Markdown: a row per pair (its order, both values, the difference), then
    the resolution over the complete pairs."""
    lines = ["| pair | order | A s/step | A' s/step | (A' - A) / A |", "|---|---|---|---|---|"]
    for i in sorted({r["pair"] for r in records if r.get("pair") is not None}):
        rs = [r for r in records if r["pair"] == i]
        order = " ".join(r["label"] for r in rs)
        v = {r["label"]: r.get("s_per_step") for r in rs if r.get("status") == "ok"}
        if v.get("A") and v.get("A'"):
            a, b = v["A"], v["A'"]
            lines.append(f"| {i + 1} | {order} | {a:.4f} | {b:.4f} | {(b - a) / a:+.1%} |")
        else:
            err = next((r.get("error") or r.get("status") for r in rs
                        if r.get("status") != "ok"), None) or "incomplete"
            lines.append(f"| {i + 1} | {order} | – | – | {err.splitlines()[0][:80]} |")
    pairs = pair_values(records)
    lines += ["", aa_resolution(pairs).text() if pairs else "A/A resolution: no complete pair",
              "", order_line(records)]
    return "\n".join(lines)


# ---------------------------------------------------------------- runs
def rank_command(enter: list[str]):
    """A ``run_jobs`` command builder: ``job_command`` with ``enter`` (the rank
    wrapper) between horovodrun's arguments and each rank's workload."""
    def command(job: JobSpec, workdir: Path) -> list[str]:
        hr, wl = job_command(job, workdir), workload_command(job, workdir)
        if hr[len(hr) - len(wl):] != wl:
            raise RuntimeError("job_command no longer ends with workload_command")
        return hr[:len(hr) - len(wl)] + enter + wl
    return command


def enter_command(groups: list[cgroups.Cgroup]) -> list[str]:
    cmd = [sys.executable, "-m", "benchmarks.cgroups", "enter"]
    for r, cg in enumerate(groups):
        cmd += ["--rank", f"{r}=" + ":".join(cg.procs_files(in_netns=True))]
    return cmd + ["--"]


def job_spec(args) -> JobSpec:
    return JobSpec(name="job0", impl="horovod", model=args.model, batch=args.batch,
                   steps=args.steps, warmup=args.warmup, threads=args.threads,
                   inter_threads=args.inter_threads, cpus="0" if args.pin == "job" else None,
                   pin_rank=args.pin == "rank")


def group_usage(cg: cgroups.Cgroup) -> dict:
    """What a rank's cgroup has seen so far (cumulative over the runs): its
    ``cpu.stat`` (periods, throttled) and peak memory, where the kernel has them."""
    out = {}
    for f in ("cpu.stat", "memory.max_usage_in_bytes", "memory.peak"):
        try:
            out[f] = cg.read(f)
        except OSError:
            pass
    return out


def execute(r: dict, args, workroot: Path, command, progress, groups=()) -> dict:
    from .harness import run_jobs
    rec = dict(r, status="ok", error=None, loadavg_before=os.getloadavg()[0])
    link = netns.ShapedLink(args.rate)
    try:
        link.create()
        res = run_jobs(link, [job_spec(args)], workroot / r["dir"],
                       args.job_timeout, progress, stall_timeout=args.stall_timeout,
                       command=command)
        rec["s_per_step"] = step_time(res["jobs"][0])
        rec["steps"] = res["jobs"][0]["steps"]
        rec["notes"] = res.get("notes", [])
        rec["rank_cgroups"] = [group_usage(cg) for cg in groups]
    except RunFailed as e:
        rec["status"], rec["error"] = "failed", str(e)
    finally:
        rec["loadavg_after"] = os.getloadavg()[0]
        link.cleanup()
    return rec


def main(argv=None) -> int:
    args = parse_args(argv)
    if not preflight("aa"):
        return 2
    netns.cleanup_stale()
    cgroups.cleanup_stale()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"command": " ".join(sys.argv), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            "git": git_rev(), "ncpu": os.cpu_count(), "loadavg": os.getloadavg()[0],
            "settings": {k: v for k, v in vars(args).items() if k != "rank_cgroup"},
            "rank_cgroup": (args.rank_cgroup[0], args.rank_cgroup[1].describe())
            if args.rank_cgroup else None}
    records: list[dict] = []
    groups: list[cgroups.Cgroup] = []
    runs = plan(args.pairs, args.seed, args.warmup_runs, args.pair_warmup)
    progress = Progress(len(runs), tag="aa")
    workroot = Path(tempfile.mkdtemp(prefix="hprio-aa-"))
    try:
        command = None
        if args.rank_cgroup:
            groups = [cgroups.Cgroup(f"aa-rank{r}", args.rank_cgroup[1]).create()
                      for r in range(2)]
            command = rank_command(enter_command(groups))
        for r in runs:
            progress.start("warm-up run (not measured)" if r["pair"] is None else
                           f"pair {r['pair'] + 1}/{args.pairs} {r['label']}")
            rec = execute(r, args, workroot, command, progress, groups)
            records.append(rec)
            progress.finish(rec["status"] + (f" {rec['s_per_step']:.4f} s/step"
                                             if rec.get("s_per_step") else
                                             f": {(rec.get('error') or '').splitlines()[0][:100]}"
                                             if rec.get("error") else ""))
            results_io.save(out, {"meta": meta, "runs": records})
    except (KeyboardInterrupt, SystemExit):
        meta["interrupted"] = True
        sys.stderr.write("\n[aa] interrupted; cleaned up, partial results kept\n")
    finally:
        for cg in groups:
            cg.remove()
        shutil.rmtree(workroot, ignore_errors=True)
    results_io.save(out, {"meta": meta, "runs": records})
    text = summary(records)
    (out / "results.md").write_text(f"# A/A probe\n\n`{meta['command']}`\n\n{text}\n")
    print(text)
    return 1 if meta.get("interrupted") or not pair_values(records) else 0


if __name__ == "__main__":
    sys.exit(main())
