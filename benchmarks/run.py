"""Run Horovod / horovod_prio jobs on one emulated shared link.

    sudo .venv/bin/python -m benchmarks.run --quick            # scenarios a+b, < 5 min
    sudo .venv/bin/python -m benchmarks.run --scenario all --repeats 3 --rate 1gbit

Scenarios (every run gets a fresh network namespace whose ``lo`` is shaped by
``tc tbf``; all ranks of all jobs of the run cross that one bottleneck):

  a  one job:  horovod vs prio
  b  two jobs at once: horovod+horovod, prio+prio, horovod+prio
  c  sweep over --rates x --batches: two jobs, horovod+horovod vs X+X for
     every other implementation X in --impls
  s  sweep over --rates x --batches: one job, horovod vs X for every X

--variant NAME=HOROVOD_PRIO_X=V[;HOROVOD_PRIO_Y=W] adds an implementation NAME:
a horovod_prio job with that environment (e.g. autotune=HOROVOD_PRIO_AUTOTUNE=1;
monitor0=HOROVOD_PRIO_MONITOR=0; the value "--overlap" as a key adds that
workload flag instead), to be listed in --impls.

--control NAME adds an implementation NAME that is plain Horovod again (an A/A
control): horovod vs NAME measured side by side shows how far two runs of the
same code differ on this box, the yardstick for any horovod_prio ratio.

Repeats are interleaved (repeat 1 of every config, then repeat 2, ...; the
config order rotates each repeat); ratios are computed between runs of the
same repeat and reported as medians over repeats.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import tempfile
from pathlib import Path

from horovod_prio.method import units

from .models import HARNESS_MODELS
from . import netns
from .harness import (REPO, JobSpec, Progress, RunFailed, check_prio_available, cpus_for,
                      git_rev, positive_int, preflight, prio_env_arg, rate_arg, run_all,
                      run_jobs)
from .netns import ShapedLink

IMPL_SHORT = {"horovod": "hvd", "prio": "prio"}


# ---------------------------------------------------------------- arguments
def _rate_list(s):
    return [rate_arg(x.strip()) for x in s.split(",") if x.strip()] or _fail_empty(s)


def _int_list(s):
    return [positive_int(x.strip()) for x in s.split(",") if x.strip()] or _fail_empty(s)


def _fail_empty(s):
    raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {s!r}")


def _scenarios(s):
    v = s.replace(",", "").replace("+", "").strip().lower()
    if v == "all":
        return "abc"
    if not v or set(v) - set("abcs"):
        raise argparse.ArgumentTypeError(f"expected a, b, c, s, a combination (ab) or all, got {s!r}")
    return "".join(sorted(set(v)))


def _impl_list(s):
    xs = [x.strip() for x in s.split(",") if x.strip()]
    if not xs:
        raise argparse.ArgumentTypeError(
            f"expected a list of horovod,prio,<variant>,<control>, got {s!r}")
    return xs


def _variant(s):
    """NAME=HOROVOD_PRIO_X=V[;...] -> (name, {env}, [workload flags])."""
    name, sep, rest = s.partition("=")
    if not sep or not name or name in ("horovod", "prio"):
        raise argparse.ArgumentTypeError(
            f"expected NAME=HOROVOD_PRIO_X=V[;HOROVOD_PRIO_Y=W] (NAME not horovod/prio), got {s!r}")
    env, flags = {}, []
    for item in filter(None, (x.strip() for x in rest.split(";"))):
        if item.startswith("--"):
            flags.append(item)
            continue
        k, v = prio_env_arg(item)
        env[k] = v
    return name, env, flags


def _delay(s):
    try:
        units.check("delay", units.parse_duration_s, s, tc=True)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))
    return s


def build_parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="short default (scenarios a+b, 1 repeat, 15 steps; < 5 min)")
    p.add_argument("--scenario", type=_scenarios, default=None,
                   help="a, b, c, a combination such as ab or a,c, or all "
                        "(default: ab with --quick, else all)")
    p.add_argument("--repeats", type=positive_int, default=None, help="default 1 quick, 3 otherwise")
    p.add_argument("--rate", type=rate_arg, default="1gbit", help="tc tbf rate for a/b (default 1gbit)")
    p.add_argument("--delay", type=_delay, default=None, help="netem delay on lo (needs sch_netem)")
    p.add_argument("--model", choices=HARNESS_MODELS, default="mlp")
    p.add_argument("--batch", type=positive_int, default=32, help="per-rank batch for a/b")
    p.add_argument("--steps", type=positive_int, default=None, help="measured steps per job")
    p.add_argument("--warmup", type=positive_int, default=3)
    p.add_argument("--rates", type=_rate_list, default=["500mbit", "1gbit", "2gbit"],
                   help="scenario c: comma-separated rates")
    p.add_argument("--batches", type=_int_list, default=[8, 32, 128],
                   help="scenario c: comma-separated per-rank batch sizes")
    p.add_argument("--impls", type=_impl_list, default=["horovod", "prio"],
                   help="comma-separated implementations to run (default horovod,prio; "
                        "--variant names too); configs using others are skipped")
    p.add_argument("--variant", type=_variant, action="append", default=[],
                   metavar="NAME=ENV=V[;ENV=V]", help="a named horovod_prio variant (repeatable)")
    p.add_argument("--control", action="append", default=[], metavar="NAME",
                   help="a plain-Horovod implementation named NAME (an A/A control; repeatable), "
                        "to be listed in --impls")
    p.add_argument("--pin", choices=["job", "rank", "none"], default="job",
                   help="job: job j on core j%%ncpu (default); rank: rank r on core r; none")
    p.add_argument("--threads", type=positive_int, default=1, help="TF threads per rank")
    p.add_argument("--inter-threads", type=positive_int, default=None,
                   help="TF inter-op threads per rank (default: --threads; hvd.overlap needs >= 2)")
    p.add_argument("--priority", default=None, metavar="JSON",
                   help="prio jobs: DistributedOptimizer(priority=<JSON object of "
                        "PriorityConfig fields>); default: HOROVOD_PRIO_* env / defaults")
    p.add_argument("--prio-env", type=prio_env_arg, action="append", default=[],
                   metavar="HOROVOD_PRIO_X=V", help="extra env for prio jobs (repeatable)")
    p.add_argument("--job-timeout", type=positive_int, default=600, help="seconds per run")
    p.add_argument("--stall-timeout", type=positive_int, default=30,
                   help="fail a run when no step finishes for this many seconds")
    p.add_argument("--out", default=None, help="results dir (default results/bench/<quick|full>)")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted sweep: keep the ok runs of OUT/results.json.gz (made by "
                        "the same command) and run only the rest")
    p.add_argument("--keep-raw", action="store_true", help="keep raw per-job logs under OUT/raw")
    return p


def parse_args(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    if a.scenario is None:
        a.scenario = "ab" if a.quick else "abc"
    if a.repeats is None:
        a.repeats = 1 if a.quick else 3
    if a.steps is None:
        a.steps = 15 if a.quick else 30
    if a.out is None:
        a.out = str(REPO / "results" / "bench" / ("quick" if a.quick else "full"))
    a.variants = {name: (env, flags) for name, env, flags in a.variant}
    for name in a.control:
        if name in ("horovod", "prio") or name in a.variants or not name.isidentifier():
            p.error(f"argument --control: {name!r} is not a new implementation name (a word, "
                    f"not horovod, prio or a --variant name)")
    unknown = [x for x in a.impls if x not in ("horovod", "prio") and x not in a.variants
               and x not in a.control]
    if unknown:
        p.error(f"argument --impls: unknown implementation(s) {', '.join(unknown)} "
                f"(horovod, prio, a --variant or a --control name)")
    if a.priority is not None:
        try:
            ok = isinstance(json.loads(a.priority), dict)
        except ValueError:
            ok = False
        if not ok:
            p.error(f"argument --priority: expected a JSON object of PriorityConfig fields, "
                    f"e.g. '{{\"num_groups\": 8}}', got {a.priority!r}")
    return a


# ---------------------------------------------------------------- scenarios
def uses_prio(args, impl: str) -> bool:
    """prio and its variants run horovod_prio; horovod and the --control names do not."""
    return impl != "horovod" and impl not in args.control


def plan(args, prio_ok: bool) -> list[dict]:
    """The list of runs, interleaved over repeats. Each: scenario, config, rate, batch, repeat."""
    groups = []   # (scenario, rate, batch, [configs])
    scen = args.scenario
    if "a" in scen:
        groups.append(("a", args.rate, args.batch, [("horovod",), ("prio",)]))
    if "b" in scen:
        groups.append(("b", args.rate, args.batch,
                       [("horovod", "horovod"), ("prio", "prio"), ("horovod", "prio")]))
    others = [x for x in args.impls if x != "horovod"]
    if "c" in scen:
        for rate in args.rates:
            for batch in args.batches:
                groups.append(("c", rate, batch, [("horovod", "horovod")] + [(x, x) for x in others]))
    if "s" in scen:
        for rate in args.rates:
            for batch in args.batches:
                groups.append(("s", rate, batch, [("horovod",)] + [(x,) for x in others]))
    runs = []
    for rep in range(args.repeats):
        for scenario, rate, batch, configs in groups:
            k = rep % len(configs)
            for cfg in configs[k:] + configs[:k]:
                skip = None
                if any(c not in args.impls for c in cfg):
                    skip = "not in --impls"
                elif any(uses_prio(args, c) for c in cfg) and not prio_ok:
                    skip = "prio-unavailable"
                runs.append({"scenario": scenario, "config": list(cfg), "rate": rate,
                             "batch": batch, "repeat": rep, "skip": skip})
    return runs


def execute_run(r: dict, args, workroot: Path, progress: Progress | None) -> dict:
    jobs = []
    for i, impl in enumerate(r["config"]):
        prio = uses_prio(args, impl)
        env = dict(args.prio_env) if prio else {}
        venv, vflags = args.variants.get(impl, ({}, []))
        env.update(venv)
        jobs.append(JobSpec(name=f"job{i}", impl="prio" if prio else "horovod", model=args.model,
                            batch=r["batch"], steps=args.steps, warmup=args.warmup,
                            threads=args.threads, inter_threads=args.inter_threads,
                            cpus=cpus_for(i, args.pin),
                            pin_rank=(args.pin == "rank"),
                            priority=args.priority if prio else None, env=env,
                            extra_args=list(vflags)))
    label = f"{r['scenario']}-{'+'.join(IMPL_SHORT.get(c, c) for c in r['config'])}-{r['rate']}-b{r['batch']}-r{r['repeat']}"
    workdir = workroot / label
    rec = dict(r, label=label, status="ok", error=None, loadavg_before=os.getloadavg()[0])
    link = ShapedLink(r["rate"], delay=args.delay)
    try:
        link.create()
        rec["qdisc"] = link.qdisc().strip()
        rec.update(run_jobs(link, jobs, workdir, args.job_timeout, progress,
                            stall_timeout=args.stall_timeout))
    except RunFailed as e:
        rec["status"], rec["error"] = "failed", str(e)
    finally:
        rec["loadavg_after"] = os.getloadavg()[0]   # 1-min: includes our own ~2-5 processes
        link.cleanup()
    return rec


def main(argv=None) -> int:
    args = parse_args(argv)
    if not preflight("bench"):
        return 2
    removed = netns.cleanup_stale()
    if removed:
        sys.stderr.write(f"[bench] removed stale namespaces: {', '.join(removed)}\n")

    prio_ok, why = False, "not requested (--impls)"
    wants_prio = any(uses_prio(args, x) for x in args.impls)   # prio or a variant of it
    if wants_prio:
        sys.stderr.write("[bench] checking horovod_prio.tensorflow.keras ...\n")
        prio_ok, why = check_prio_available()
    if not prio_ok and wants_prio:
        sys.stderr.write(f"[bench] horovod_prio binding unavailable ({why}); prio configs skipped\n")

    runs = plan(args, prio_ok)
    out = Path(args.out)
    argv_now = list(sys.argv[1:] if argv is None else argv)
    command = "python -m benchmarks.run " + " ".join(a for a in argv_now if a != "--resume")
    earlier, previous = {}, None
    if args.resume:
        try:
            previous, earlier = resumable(out, command)
        except ValueError as e:
            sys.stderr.write(f"[bench] --resume: {e}\n")
            return 2
    todo = [r for r in runs if not r["skip"] and run_key(r) not in earlier]
    out.mkdir(parents=True, exist_ok=True)
    workroot = Path(tempfile.mkdtemp(prefix="hprio-bench-"))
    progress = Progress(len(todo))
    results = {"meta": results_meta(args, prio_ok, why, command), "runs": []}
    if previous is not None:   # the sweep started earlier: its date and commit, then each resume
        meta = results["meta"]
        meta["resumed"] = list(previous.get("resumed", [])) + [
            {"date": meta["date"], "git": meta["git"], "runs_kept": len(earlier)}]
        meta["date"], meta["git"] = previous.get("date"), previous.get("git")
    stopped, failed = run_all(
        runs, results, out, workroot, progress, keep_raw=args.keep_raw, tag="bench", write=_write,
        describe=lambda r: (f"{r['scenario']}: {' + '.join(r['config'])} @ {r['rate']} "
                            f"batch {r['batch']} (repeat {r['repeat'] + 1}/{args.repeats})"),
        execute=lambda r: execute_run(r, args, workroot, progress),
        reuse=lambda r: earlier.get(run_key(r)))
    if stopped is not None:
        return stopped
    from . import report
    sys.stdout.write(report.markdown(results) + "\n")
    sys.stderr.write(f"[bench] wrote {out}/results.json.gz, results.md, steps.png\n")
    return 1 if failed else 0


def results_meta(args, prio_ok: bool, why: str, command: str) -> dict:
    """``results.json``'s meta of a run of ``args`` (what the report reads back)."""
    return {
        "command": command,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "ncpu": os.cpu_count(), "pin": args.pin, "threads": args.threads,
        "inter_threads": args.inter_threads,
        "model": args.model, "steps": args.steps, "warmup": args.warmup,
        "repeats": args.repeats, "delay": args.delay, "priority": args.priority,
        "prio_env": dict(args.prio_env), "prio_available": prio_ok, "impls": args.impls,
        "variants": {k: {"env": e, "flags": f} for k, (e, f) in args.variants.items()},
        "controls": list(args.control),
        "prio_unavailable_reason": None if prio_ok else why,
        "git": git_rev(),
    }


def run_key(r: dict) -> tuple:
    return (r["scenario"], tuple(r["config"]), r["rate"], r["batch"], r["repeat"])


def resumable(out: Path, command: str) -> tuple[dict, dict]:
    """The meta and the ok runs (by ``run_key``) of an earlier invocation of
    ``command`` whose results are in ``out``; ValueError naming what does not fit."""
    from . import results_io
    try:
        path = results_io.results_path(out)
        old = results_io.load(path)
        meta, old_runs = old["meta"], old["runs"]
    except FileNotFoundError:
        raise ValueError(f"nothing to resume: {out / results_io.COMPACT} does not exist") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a benchmarks.run results file ({e})") from None
    if meta.get("command") != command:
        raise ValueError(f"{path} was made by a different command:\n  {meta.get('command')}\n"
                         f"this one is:\n  {command}")
    return meta, {run_key(r): r for r in old_runs if r.get("status") == "ok"}


def _write(results: dict, out: Path) -> None:
    from . import report, results_io
    results_io.save(out, results)
    report.write_report(results, out)


if __name__ == "__main__":
    sys.exit(main())
