"""Run Horovod / horovod_prio jobs on one emulated shared link.

    sudo .venv/bin/python -m benchmarks.run --quick            # what `make bench` runs
    sudo .venv/bin/python -m benchmarks.run --scenario all --repeats 3 --rate 1gbit

Scenarios (every run gets a fresh network namespace whose ``lo`` is shaped by
``tc tbf``; all ranks of all jobs of the run cross that one bottleneck):

  a  one job:  horovod vs prio
  b  two jobs at once: horovod+horovod, prio+prio, horovod+prio
  c  sweep over --rates x --batches: two jobs, horovod+horovod vs prio+prio

Repeats are interleaved (repeat 1 of every config, then repeat 2, ...; the
config order rotates each repeat); ratios are computed between runs of the
same repeat and reported as medians over repeats.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import netns
from .netns import HarnessError, ShapedLink
from .workload import _positive_int

REPO = Path(__file__).resolve().parent.parent
IMPL_SHORT = {"horovod": "hvd", "prio": "prio"}


class RunFailed(RuntimeError):
    pass


class _LingeringJobs(Exception):
    """Every job wrote all its steps but some process has not exited."""


# ---------------------------------------------------------------- arguments
def _rate(s):
    try:
        netns.parse_rate(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))
    return s.lower()


def _rate_list(s):
    return [_rate(x.strip()) for x in s.split(",") if x.strip()] or _fail_empty(s)


def _int_list(s):
    return [_positive_int(x.strip()) for x in s.split(",") if x.strip()] or _fail_empty(s)


def _fail_empty(s):
    raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {s!r}")


def _scenarios(s):
    v = s.replace(",", "").replace("+", "").strip().lower()
    if v == "all":
        return "abc"
    if not v or set(v) - set("abc"):
        raise argparse.ArgumentTypeError(f"expected a, b, c, a combination (ab) or all, got {s!r}")
    return "".join(sorted(set(v)))


def _impl_list(s):
    xs = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in xs if x not in ("horovod", "prio")]
    if bad or not xs:
        raise argparse.ArgumentTypeError(f"expected a list of horovod,prio, got {s!r}")
    return xs


def _delay(s):
    try:
        netns.parse_time(s, "delay")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))
    return s


def _prio_env(s):
    if "=" not in s:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {s!r}")
    k, v = s.split("=", 1)
    if not k.startswith("HOROVOD_PRIO_"):
        raise argparse.ArgumentTypeError(f"key must start with HOROVOD_PRIO_, got {k!r}")
    return (k, v)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="short default (scenarios a+b, 1 repeat, 15 steps; < 5 min)")
    p.add_argument("--scenario", type=_scenarios, default=None,
                   help="a, b, c, a combination such as ab or a,c, or all "
                        "(default: ab with --quick, else all)")
    p.add_argument("--repeats", type=_positive_int, default=None, help="default 1 quick, 3 otherwise")
    p.add_argument("--rate", type=_rate, default="1gbit", help="tc tbf rate for a/b (default 1gbit)")
    p.add_argument("--delay", type=_delay, default=None, help="netem delay on lo (needs sch_netem)")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--batch", type=_positive_int, default=32, help="per-rank batch for a/b")
    p.add_argument("--steps", type=_positive_int, default=None, help="measured steps per job")
    p.add_argument("--warmup", type=_positive_int, default=3)
    p.add_argument("--rates", type=_rate_list, default=["500mbit", "1gbit", "2gbit"],
                   help="scenario c: comma-separated rates")
    p.add_argument("--batches", type=_int_list, default=[8, 32, 128],
                   help="scenario c: comma-separated per-rank batch sizes")
    p.add_argument("--impls", type=_impl_list, default=["horovod", "prio"],
                   help="comma-separated implementations to run (default horovod,prio); "
                        "configs using others are skipped")
    p.add_argument("--pin", choices=["job", "rank", "none"], default="job",
                   help="job: job j on core j%%ncpu (default); rank: rank r on core r; none")
    p.add_argument("--threads", type=_positive_int, default=1, help="TF threads per rank")
    p.add_argument("--priority", default=None, metavar="JSON",
                   help="prio jobs: DistributedOptimizer(priority=<JSON object of "
                        "PriorityConfig fields>); default: HOROVOD_PRIO_* env / defaults")
    p.add_argument("--prio-env", type=_prio_env, action="append", default=[],
                   metavar="HOROVOD_PRIO_X=V", help="extra env for prio jobs (repeatable)")
    p.add_argument("--job-timeout", type=_positive_int, default=600, help="seconds per run")
    p.add_argument("--stall-timeout", type=_positive_int, default=30,
                   help="fail a run when no step finishes for this many seconds")
    p.add_argument("--out", default=None, help="results dir (default results/bench/<quick|full>)")
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
    if a.priority is not None:
        try:
            ok = isinstance(json.loads(a.priority), dict)
        except ValueError:
            ok = False
        if not ok:
            p.error(f"argument --priority: expected a JSON object of PriorityConfig fields, "
                    f"e.g. '{{\"num_groups\": 8}}', got {a.priority!r}")
    return a


# ---------------------------------------------------------------- jobs
@dataclass
class JobSpec:
    name: str
    impl: str
    model: str = "mlp"
    batch: int = 32
    steps: int = 15
    warmup: int = 3
    threads: int = 1
    cpus: str | None = None       # taskset list for the whole job
    pin_rank: bool = False
    priority: str | None = None
    env: dict = field(default_factory=dict)
    extra_args: list = field(default_factory=list)


def _venv_bin() -> Path:
    return Path(sys.executable).parent


def horovodrun_path() -> str:
    cand = _venv_bin() / "horovodrun"
    if cand.exists():
        return str(cand)
    w = shutil.which("horovodrun")
    if not w:
        raise HarnessError("horovodrun not found: install horovod (make install) and run with "
                           ".venv/bin/python")
    return w


def job_command(job: JobSpec, workdir: Path) -> list[str]:
    """horovodrun command line of one job.

    Ports: horovodrun's rendezvous server binds a random free port (its
    find_port() retries on EADDRINUSE), and Gloo's pairs bind ephemeral ports,
    so concurrent jobs in one namespace never collide; the chosen port is
    recorded in each job's meta ("rendezvous")."""
    w = workdir / job.name
    cmd = [horovodrun_path(), "--gloo", "--network-interface", "lo",
           "-np", "2", "-H", "localhost:2",
           "--gloo-timeout-seconds", "120", "--start-timeout", "120",
           sys.executable, "-m", "benchmarks.workload",
           "--impl", job.impl, "--model", job.model, "--batch", str(job.batch),
           "--steps", str(job.steps), "--warmup", str(job.warmup),
           "--threads", str(job.threads),
           "--out", f"{w}.steps.jsonl", "--meta-out", f"{w}.meta.json",
           "--events-out", f"{w}.events.jsonl",
           "--ready-file", f"{w}.ready", "--go-file", str(workdir / "go")]
    if job.pin_rank:
        cmd.append("--pin-rank")
    if job.priority is not None and job.impl == "prio":
        cmd += ["--priority", str(job.priority)]
    return cmd + list(job.extra_args)


def _fix_legacy_keras(env: dict) -> dict:
    """TF_USE_LEGACY_KERAS=1 (exported by the Makefile for TF 2.16) makes TF 2.15
    fail to import Keras when tf_keras is not installed: drop it in that case."""
    import importlib.util
    if env.get("TF_USE_LEGACY_KERAS") and importlib.util.find_spec("tf_keras") is None:
        env.pop("TF_USE_LEGACY_KERAS")
    return env


def job_env(job: JobSpec, workdir: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{_venv_bin()}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(REPO)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _fix_legacy_keras(env)
    env["OMP_NUM_THREADS"] = str(job.threads)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if job.impl == "prio":
        env.setdefault("HOROVOD_PRIO_TRACE", str(workdir / f"{job.name}.trace.json"))
    env.update(job.env)
    return env


def _read_jsonl(path: Path) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def _tail(path: Path, n=25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


class Progress:
    """Plain-text progress on stderr (a redrawn line on a tty)."""

    def __init__(self, total_runs: int, stream=sys.stderr):
        self.total, self.done, self.stream = total_runs, 0, stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.t0 = time.monotonic()
        self._last = 0.0

    def start(self, label: str):
        self.label = label
        self.stream.write(f"[bench] run {self.done + 1}/{self.total}: {label}\n")
        self.stream.flush()

    def update(self, text: str):
        now = time.monotonic()
        if self.tty:
            self.stream.write(f"\r[bench]   {text}   ")
            self.stream.flush()
        elif now - self._last > 15:
            self.stream.write(f"[bench]   {text}\n")
            self.stream.flush()
            self._last = now

    def finish(self, status: str):
        self.done += 1
        el = time.monotonic() - self.t0
        bar = "#" * (20 * self.done // max(1, self.total))
        if self.tty:
            self.stream.write("\n")
        self.stream.write(f"[bench] [{bar:<20}] {self.done}/{self.total} {status} "
                          f"({el:.0f}s elapsed)\n")
        self.stream.flush()


def run_jobs(link: ShapedLink, jobs: list[JobSpec], workdir: Path, timeout: float,
             progress: Progress | None = None, stall_timeout: float = 60.0,
             exit_grace: float = 30.0) -> dict:
    """Start ``jobs`` in ``link``, release them together after warmup, wait.

    Raises RunFailed (with the failing job's log tail) if a job exits non-zero
    or the run exceeds ``timeout``, or -- once a first step has finished -- no
    job finishes a step for ``stall_timeout`` seconds; the caller's ShapedLink
    cleanup then kills whatever is left. Jobs that wrote all their steps but
    do not exit within ``exit_grace`` seconds are killed and the run is kept,
    with a note in ``result["notes"]``."""
    workdir.mkdir(parents=True, exist_ok=True)
    procs = {}
    t_begin = time.monotonic()
    for job in jobs:
        log = open(workdir / f"{job.name}.log", "w")
        procs[job.name] = link.popen(job_command(job, workdir), cpus=job.cpus,
                                     env=job_env(job, workdir), cwd=str(REPO),
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def check_failed():
        for job in jobs:
            rc = procs[job.name].poll()
            if rc is not None and rc != 0:
                tail = _tail(workdir / f"{job.name}.log")
                last = next((l for l in reversed(tail.splitlines()) if l.strip()), "")
                raise RunFailed(f"job {job.name} ({job.impl}) exited with status {rc}: "
                                f"{last.strip()[:200]}\nlog tail:\n{tail}")

    stall = {"n": 0, "t": time.monotonic(), "checked": 0.0}

    def check_timeout():
        now = time.monotonic()
        if now - t_begin > timeout:
            raise RunFailed(f"run exceeded --job-timeout {timeout:.0f}s")
        if now - stall["checked"] < 1.0:
            return
        stall["checked"] = now
        counts = {j.name: _count_lines(workdir / f"{j.name}.steps.jsonl") for j in jobs}
        n = sum(counts.values())
        if all(counts[j.name] >= j.warmup + j.steps for j in jobs):
            stall.setdefault("all_done", now)
            if now - stall["all_done"] > exit_grace:
                raise _LingeringJobs()
            return
        if n != stall["n"] or 0 in counts.values():   # progress, or a job still starting
            stall["n"], stall["t"] = n, now
        elif now - stall["t"] > stall_timeout:
            raise RunFailed(f"stalled: no step finished for {stall_timeout:.0f}s "
                            f"(--stall-timeout; steps so far {counts}, waiting at "
                            f"{'go' if (workdir / 'go').exists() else 'warmup'})")

    # phase 1: until every job has finished its warmup steps
    while not all((workdir / f"{j.name}.ready").exists() for j in jobs):
        check_failed()
        for job in jobs:
            if procs[job.name].poll() == 0:
                raise RunFailed(f"job {job.name} exited before its warmup finished")
        check_timeout()
        if progress:
            progress.update(f"starting/warmup {time.monotonic() - t_begin:.0f}s")
        time.sleep(0.1)

    samples = [(time.time(), link.bytes_sent())]
    (workdir / "go").touch()
    t_go = time.time()
    last_sample = time.monotonic()
    total = sum(j.warmup + j.steps for j in jobs)
    notes = []
    while any(p.poll() is None for p in procs.values()):
        check_failed()
        try:
            check_timeout()
        except _LingeringJobs:
            left = [j.name for j in jobs if procs[j.name].poll() is None]
            notes.append(f"{', '.join(left)} did not exit within {exit_grace:.0f}s after "
                         f"the last step; killed (steps complete)")
            link.kill_processes()
            break
        if time.monotonic() - last_sample >= 0.5:
            samples.append((time.time(), link.bytes_sent()))
            last_sample = time.monotonic()
            if progress:
                done = sum(_count_lines(workdir / f"{j.name}.steps.jsonl") for j in jobs)
                progress.update(f"steps {done}/{total}  {time.time() - t_go:.0f}s since go")
        time.sleep(0.05)
    if not notes:
        check_failed()
    samples.append((time.time(), link.bytes_sent()))

    result = {"t_go": t_go, "link_samples": samples, "jobs": [], "notes": notes}
    for job in jobs:
        w = workdir / job.name
        meta = json.loads(Path(f"{w}.meta.json").read_text()) if Path(f"{w}.meta.json").exists() else {}
        trace_events = []
        for tp in sorted(workdir.glob(f"{job.name}.trace.json*")):
            trace_events += _trace_policy_events(tp)
        result["jobs"].append({
            "name": job.name, "impl": job.impl, "model": job.model, "batch": job.batch,
            "cpus": job.cpus, "pin_rank": job.pin_rank, "priority": job.priority,
            "steps": _read_jsonl(Path(f"{w}.steps.jsonl")), "meta": meta,
            "events": _read_jsonl(Path(f"{w}.events.jsonl")), "trace_events": trace_events,
        })
    return result


def _trace_policy_events(path: Path) -> list[dict]:
    """Policy (boost raise/decay) events of a Chrome trace, with ts in seconds.

    ``ts`` stays as written (microseconds); report.py aligns it to wall time."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    evs = data.get("traceEvents", []) if isinstance(data, dict) else data
    out = []
    for e in evs if isinstance(evs, list) else []:
        if not isinstance(e, dict):
            continue
        text = " ".join(str(e.get(k, "")) for k in ("name", "cat")) + " " + json.dumps(e.get("args", {}))
        t = text.lower()
        if any(w in t for w in ("raise", "decay", "boost", "policy")):
            out.append({"ts_us": e.get("ts"), "name": e.get("name"), "cat": e.get("cat"),
                        "args": e.get("args", {})})
    return out


# ---------------------------------------------------------------- scenarios
def _cpus_for(job_index: int, pin: str) -> str | None:
    if pin == "job":
        return str(job_index % (os.cpu_count() or 1))
    return None


def plan(args, prio_ok: bool) -> list[dict]:
    """The list of runs, interleaved over repeats. Each: scenario, config, rate, batch, repeat."""
    groups = []   # (scenario, rate, batch, [configs])
    scen = args.scenario
    if "a" in scen:
        groups.append(("a", args.rate, args.batch, [("horovod",), ("prio",)]))
    if "b" in scen:
        groups.append(("b", args.rate, args.batch,
                       [("horovod", "horovod"), ("prio", "prio"), ("horovod", "prio")]))
    if "c" in scen:
        for rate in args.rates:
            for batch in args.batches:
                groups.append(("c", rate, batch, [("horovod", "horovod"), ("prio", "prio")]))
    runs = []
    for rep in range(args.repeats):
        for scenario, rate, batch, configs in groups:
            k = rep % len(configs)
            for cfg in configs[k:] + configs[:k]:
                skip = None
                if any(c not in args.impls for c in cfg):
                    skip = "not in --impls"
                elif "prio" in cfg and not prio_ok:
                    skip = "prio-unavailable"
                runs.append({"scenario": scenario, "config": list(cfg), "rate": rate,
                             "batch": batch, "repeat": rep, "skip": skip})
    return runs


def check_prio_available(timeout=180) -> tuple[bool, str]:
    """Can ``horovod_prio.tensorflow.keras`` be imported in this venv?"""
    env = _fix_legacy_keras(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO)))
    try:
        p = subprocess.run([sys.executable, "-c", "import horovod_prio.tensorflow.keras as h; "
                            "assert hasattr(h, 'DistributedOptimizer')"],
                           capture_output=True, text=True, timeout=timeout, cwd=str(REPO), env=env)
    except subprocess.TimeoutExpired:
        return False, "import timed out"
    if p.returncode == 0:
        return True, ""
    err = (p.stderr.strip().splitlines() or ["?"])[-1]
    return False, err


def execute_run(r: dict, args, workroot: Path, progress: Progress | None) -> dict:
    jobs = []
    for i, impl in enumerate(r["config"]):
        env = dict(args.prio_env) if impl == "prio" else {}
        jobs.append(JobSpec(name=f"job{i}", impl=impl, model=args.model, batch=r["batch"],
                            steps=args.steps, warmup=args.warmup, threads=args.threads,
                            cpus=_cpus_for(i, args.pin), pin_rank=(args.pin == "rank"),
                            priority=args.priority if impl == "prio" else None, env=env))
    label = f"{r['scenario']}-{'+'.join(IMPL_SHORT[c] for c in r['config'])}-{r['rate']}-b{r['batch']}-r{r['repeat']}"
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


def preflight(tag) -> bool:
    """Signal handlers, root, tools and horovodrun; False (after saying why) if missing."""
    netns.install_signal_handlers()
    try:
        netns.require_root()
        netns.require_tools()
        horovodrun_path()
    except HarnessError as e:
        sys.stderr.write(f"[{tag}] error: {e}\n")
        return False
    return True


def main(argv=None) -> int:
    args = parse_args(argv)
    if not preflight("bench"):
        return 2
    removed = netns.cleanup_stale()
    if removed:
        sys.stderr.write(f"[bench] removed stale namespaces: {', '.join(removed)}\n")

    prio_ok, why = False, "not requested (--impls)"
    if "prio" in args.impls:
        sys.stderr.write("[bench] checking horovod_prio.tensorflow.keras ...\n")
        prio_ok, why = check_prio_available()
    if not prio_ok and "prio" in args.impls:
        sys.stderr.write(f"[bench] horovod_prio binding unavailable ({why}); prio configs skipped\n")

    runs = plan(args, prio_ok)
    todo = [r for r in runs if not r["skip"]]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workroot = Path(tempfile.mkdtemp(prefix="hprio-bench-"))
    progress = Progress(len(todo))
    results = {
        "meta": {
            "command": "python -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "ncpu": os.cpu_count(), "pin": args.pin, "threads": args.threads,
            "model": args.model, "steps": args.steps, "warmup": args.warmup,
            "repeats": args.repeats, "delay": args.delay, "priority": args.priority,
            "prio_env": dict(args.prio_env), "prio_available": prio_ok, "impls": args.impls,
            "prio_unavailable_reason": None if prio_ok else why,
            "git": _git_rev(),
        },
        "runs": [],
    }
    stopped, failed = run_all(
        runs, results, out, workroot, progress, keep_raw=args.keep_raw, tag="bench", write=_write,
        describe=lambda r: (f"{r['scenario']}: {' + '.join(r['config'])} @ {r['rate']} "
                            f"batch {r['batch']} (repeat {r['repeat'] + 1}/{args.repeats})"),
        execute=lambda r: execute_run(r, args, workroot, progress))
    if stopped is not None:
        return stopped
    from . import report
    sys.stdout.write(report.markdown(results) + "\n")
    sys.stderr.write(f"[bench] wrote {out}/results.json, results.md, steps.png\n")
    return 1 if failed else 0


def run_all(runs, results, out: Path, workroot: Path, progress, *, keep_raw: bool, tag: str,
            write, describe, execute, raw_ignore=None):
    """Execute planned runs in order (``execute(r)`` -> record; a run with a
    ``skip`` reason is recorded as skipped), rewriting the report after each so
    partial results survive an interrupt. On Ctrl-C / SystemExit the partial
    results are kept and marked. The work directory is copied to ``out/raw``
    with ``keep_raw`` (``raw_ignore``: a ``shutil.ignore_patterns``), then
    removed. Returns ``(exit code if interrupted else None, failed runs)``."""
    failed = 0
    try:
        for r in runs:
            if r.get("skip"):
                results["runs"].append(dict(r, label=None, status="skipped", error=r["skip"]))
                continue
            progress.start(describe(r))
            rec = execute(r)
            results["runs"].append(rec)
            failed += rec["status"] != "ok"
            progress.finish(rec["status"] + ("" if rec["status"] == "ok" else ": " +
                                             rec["error"].splitlines()[0]))
            write(results, out)
    except (KeyboardInterrupt, SystemExit) as e:
        sys.stderr.write(f"\n[{tag}] interrupted; cleaned up, partial results kept\n")
        results["meta"]["interrupted"] = True
        write(results, out)
        return (e.code if isinstance(e, SystemExit) and isinstance(e.code, int) else 130), failed
    finally:
        if keep_raw:
            shutil.copytree(workroot, out / "raw", dirs_exist_ok=True, ignore=raw_ignore)
        shutil.rmtree(workroot, ignore_errors=True)
    write(results, out)
    return None, failed


def _write(results: dict, out: Path) -> None:
    from . import report
    (out / "results.json").write_text(json.dumps(results, indent=1))
    report.write_report(results, out)


def _git_rev() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=str(REPO), timeout=10).stdout.strip() or None
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
