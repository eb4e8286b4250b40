"""Pieces shared by the benchmark harnesses (``run``, ``arbiter_bench``, ``cluster``).

Public API:

- ``JobSpec``, ``job_command``, ``workload_command``, ``job_env``, ``go_file``,
  ``horovodrun_path`` -- one 2-rank ``horovodrun`` job of ``benchmarks.workload``;
- ``run_jobs`` -- start jobs in a launcher (a ``netns.ShapedLink``), release
  them together after their warmup, wait, collect steps / meta / events;
- ``run_all`` -- execute a plan of runs, rewriting the report after each;
- ``Progress``, ``preflight``, ``check_prio_available``, ``git_rev``,
  ``cpus_for``, ``read_jsonl``, ``count_lines``, ``log_tail``,
  ``trace_policy_events``;
- argument types ``positive_int``, ``rate_arg``, ``prio_env_arg``;
- ``ArbiterProcess`` -- a ``horovod-prio arbiter`` subprocess (optionally inside
  a network namespace) with its ``--stats``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from horovod_prio.method import units

from . import netns
from .netns import HarnessError, ShapedLink

REPO = Path(__file__).resolve().parent.parent


class RunFailed(RuntimeError):
    pass


class LingeringJobs(Exception):
    """Every job wrote all its steps but some process has not exited."""


# ---------------------------------------------------------------- argument types
positive_int = units.arg(units.parse_int, 1)


def rate_arg(s):
    try:
        units.check("rate", units.parse_rate_bits_per_s, s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))
    return s.lower()


def prio_env_arg(s):
    if "=" not in s:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {s!r}")
    k, v = s.split("=", 1)
    if not k.startswith("HOROVOD_PRIO_"):
        raise argparse.ArgumentTypeError(f"key must start with HOROVOD_PRIO_, got {k!r}")
    return (k, v)


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
    inter_threads: int | None = None   # TF inter-op threads (None: threads)
    cpus: str | None = None       # taskset list for the whole job
    pin_rank: bool = False
    priority: str | None = None
    env: dict = field(default_factory=dict)
    extra_args: list = field(default_factory=list)
    start: float = 0.0            # seconds after the common go before this job's go


def go_file(job: JobSpec, workdir: Path) -> Path:
    """The file ``job`` waits for after its warmup: the common ``go`` file, or
    its own ``<name>.go`` when it starts ``job.start`` seconds later."""
    return workdir / "go" if not job.start else workdir / f"{job.name}.go"


def venv_bin() -> Path:
    return Path(sys.executable).parent


def horovodrun_path() -> str:
    cand = venv_bin() / "horovodrun"
    if cand.exists():
        return str(cand)
    w = shutil.which("horovodrun")
    if not w:
        raise HarnessError("horovodrun not found: install horovod (make install) and run with "
                           ".venv/bin/python")
    return w


def workload_command(job: JobSpec, workdir: Path) -> list[str]:
    """``python -m benchmarks.workload ...`` of one job: what every rank runs, with
    its step, meta and event files in ``workdir`` and its ready / go files."""
    w = workdir / job.name
    cmd = [sys.executable, "-m", "benchmarks.workload",
           "--impl", job.impl, "--model", job.model, "--batch", str(job.batch),
           "--steps", str(job.steps), "--warmup", str(job.warmup),
           "--threads", str(job.threads),
           *(["--inter-threads", str(job.inter_threads)] if job.inter_threads else []),
           "--out", f"{w}.steps.jsonl", "--meta-out", f"{w}.meta.json",
           "--events-out", f"{w}.events.jsonl",
           "--ready-file", f"{w}.ready", "--go-file", str(go_file(job, workdir))]
    if job.pin_rank:
        cmd.append("--pin-rank")
    if job.priority is not None and job.impl == "prio":
        cmd += ["--priority", str(job.priority)]
    return cmd + list(job.extra_args)


def job_command(job: JobSpec, workdir: Path) -> list[str]:
    """horovodrun command line of one job (both ranks on this host, over ``lo``).

    Ports: horovodrun's rendezvous server binds a random free port (its
    find_port() retries on EADDRINUSE), and Gloo's pairs bind ephemeral ports,
    so concurrent jobs in one namespace never collide; the chosen port is
    recorded in each job's meta ("rendezvous")."""
    return [horovodrun_path(), "--gloo", "--network-interface", "lo",
            "-np", "2", "-H", "localhost:2",
            "--gloo-timeout-seconds", "120", "--start-timeout", "120"] + workload_command(job, workdir)


def fix_legacy_keras(env: dict) -> dict:
    """TF_USE_LEGACY_KERAS=1 (exported by the Makefile for TF 2.16) makes TF 2.15
    fail to import Keras when tf_keras is not installed: drop it in that case."""
    import importlib.util
    if env.get("TF_USE_LEGACY_KERAS") and importlib.util.find_spec("tf_keras") is None:
        env.pop("TF_USE_LEGACY_KERAS")
    return env


def job_env(job: JobSpec, workdir: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{venv_bin()}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(REPO)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    fix_legacy_keras(env)
    env["OMP_NUM_THREADS"] = str(job.threads)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if job.impl == "prio":
        env.setdefault("HOROVOD_PRIO_TRACE", str(workdir / f"{job.name}.trace.json"))
    env.update(job.env)
    return env


def read_jsonl(path: Path) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def log_tail(path: Path, n=25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


class Progress:
    """Plain-text progress on stderr (a redrawn line on a tty)."""

    def __init__(self, total_runs: int, stream=sys.stderr, tag: str = "bench"):
        self.total, self.done, self.stream, self.tag = total_runs, 0, stream, tag
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.t0 = time.monotonic()
        self._last = 0.0

    def start(self, label: str):
        self.label = label
        self.stream.write(f"[{self.tag}] run {self.done + 1}/{self.total}: {label}\n")
        self.stream.flush()

    def update(self, text: str):
        now = time.monotonic()
        if self.tty:
            self.stream.write(f"\r[{self.tag}]   {text}   ")
            self.stream.flush()
        elif now - self._last > 15:
            self.stream.write(f"[{self.tag}]   {text}\n")
            self.stream.flush()
            self._last = now

    def finish(self, status: str):
        self.done += 1
        el = time.monotonic() - self.t0
        bar = "#" * (20 * self.done // max(1, self.total))
        if self.tty:
            self.stream.write("\n")
        self.stream.write(f"[{self.tag}] [{bar:<20}] {self.done}/{self.total} {status} "
                          f"({el:.0f}s elapsed)\n")
        self.stream.flush()


def run_jobs(link: ShapedLink, jobs: list[JobSpec], workdir: Path, timeout: float,
             progress: Progress | None = None, stall_timeout: float = 60.0,
             exit_grace: float = 30.0, command=None, env=None, on_go=None) -> dict:
    """Start ``jobs`` in ``link``, release them together after warmup, wait.

    ``link`` is anything with ``popen(argv, cpus=, **Popen kwargs)``,
    ``bytes_sent()`` and ``kill_processes()`` (a ``netns.ShapedLink``, or the
    testbed's launcher in ``benchmarks.cluster``); ``command(job, workdir)`` and
    ``env(job, workdir)`` build a job's argv and environment (default
    ``job_command`` / ``job_env``). Every job is released by its go file once
    all jobs are warm: at once, or ``job.start`` seconds after the others
    (``go_file``); ``on_go(t_go)`` is called right after the common go.

    Raises RunFailed (with the failing job's log tail) if a job exits non-zero
    or the run exceeds ``timeout``, or -- once a first step has finished -- no
    job finishes a step for ``stall_timeout`` seconds; the caller's ShapedLink
    cleanup then kills whatever is left. Jobs that wrote all their steps but
    do not exit within ``exit_grace`` seconds are killed and the run is kept,
    with a note in ``result["notes"]``."""
    workdir.mkdir(parents=True, exist_ok=True)
    command = command or job_command
    env = env or job_env
    procs = {}
    t_begin = time.monotonic()
    for job in jobs:
        log = open(workdir / f"{job.name}.log", "w")
        procs[job.name] = link.popen(command(job, workdir), cpus=job.cpus,
                                     env=env(job, workdir), cwd=str(REPO),
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
    pending = sorted((j for j in jobs if j.start), key=lambda j: j.start)   # later releases

    def check_failed():
        for job in jobs:
            rc = procs[job.name].poll()
            if rc is not None and rc != 0:
                tail = log_tail(workdir / f"{job.name}.log")
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
        counts = {j.name: count_lines(workdir / f"{j.name}.steps.jsonl") for j in jobs}
        n = sum(counts.values())
        if all(counts[j.name] >= j.warmup + j.steps for j in jobs):
            stall.setdefault("all_done", now)
            if now - stall["all_done"] > exit_grace:
                raise LingeringJobs()
            return
        if n != stall["n"] or 0 in counts.values() or pending:
            # progress, a job still starting, or a job not released yet
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
    if on_go is not None:
        on_go(t_go)
    last_sample = time.monotonic()
    released = {}
    total = sum(j.warmup + j.steps for j in jobs)
    notes = []
    while any(p.poll() is None for p in procs.values()):
        while pending and time.time() >= t_go + pending[0].start:
            job = pending.pop(0)
            go_file(job, workdir).touch()
            released[job.name] = time.time()
        check_failed()
        try:
            check_timeout()
        except LingeringJobs:
            left = [j.name for j in jobs if procs[j.name].poll() is None]
            notes.append(f"{', '.join(left)} did not exit within {exit_grace:.0f}s after "
                         f"the last step; killed (steps complete)")
            link.kill_processes()
            break
        if time.monotonic() - last_sample >= 0.5:
            samples.append((time.time(), link.bytes_sent()))
            last_sample = time.monotonic()
            if progress:
                done = sum(count_lines(workdir / f"{j.name}.steps.jsonl") for j in jobs)
                progress.update(f"steps {done}/{total}  {time.time() - t_go:.0f}s since go")
        time.sleep(0.05)
    if not notes:
        check_failed()
    samples.append((time.time(), link.bytes_sent()))

    result = {"t_go": t_go, "link_samples": samples, "jobs": [], "notes": notes}
    if released:
        result["released"] = released
    for job in jobs:
        w = workdir / job.name
        meta = json.loads(Path(f"{w}.meta.json").read_text()) if Path(f"{w}.meta.json").exists() else {}
        trace_events = []
        for tp in sorted(workdir.glob(f"{job.name}.trace.json*")):
            trace_events += trace_policy_events(tp)
        result["jobs"].append({
            "name": job.name, "impl": job.impl, "model": job.model, "batch": job.batch,
            "cpus": job.cpus, "pin_rank": job.pin_rank, "priority": job.priority,
            "steps": read_jsonl(Path(f"{w}.steps.jsonl")), "meta": meta,
            "rank_cpu": rank_cpu(workdir, job.name),
            "events": read_jsonl(Path(f"{w}.events.jsonl")), "trace_events": trace_events,
        })
    return result


def rank_cpu(workdir: Path, name: str) -> dict:
    """The other ranks' per-step CPU records (``<job>.steps.jsonl.rank<r>``, see
    ``benchmarks.workload``), keyed by rank as a string (JSON keys)."""
    out = {}
    for p in sorted(workdir.glob(f"{name}.steps.jsonl.rank*")):
        r = p.name.rsplit(".rank", 1)[1]
        if r.isdigit():
            out[r] = read_jsonl(p)
    return out


def trace_policy_events(path: Path) -> list[dict]:
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


def cpus_for(job_index: int, pin: str) -> str | None:
    if pin == "job":
        return str(job_index % (os.cpu_count() or 1))
    return None


def check_prio_available(timeout=180) -> tuple[bool, str]:
    """Can ``horovod_prio.tensorflow.keras`` be imported in this venv?"""
    env = fix_legacy_keras(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO)))
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


def run_all(runs, results, out: Path, workroot: Path, progress, *, keep_raw: bool, tag: str,
            write, describe, execute, raw_ignore=None, reuse=None):
    """Execute planned runs in order (``execute(r)`` -> record; a run with a
    ``skip`` reason is recorded as skipped; ``reuse(r)`` -> a record from an
    earlier, interrupted invocation is kept instead of running ``r`` again),
    rewriting the report after each so partial results survive an interrupt. On
    Ctrl-C / SystemExit the partial results are kept and marked. The work directory is copied to ``out/raw``
    with ``keep_raw`` (``raw_ignore``: a ``shutil.ignore_patterns``), then
    removed. Returns ``(exit code if interrupted else None, failed runs)``."""
    failed = 0
    try:
        for r in runs:
            if r.get("skip"):
                results["runs"].append(dict(r, label=None, status="skipped", error=r["skip"]))
                continue
            old = reuse(r) if reuse is not None else None
            if old is not None:
                results["runs"].append(old)
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


def git_rev() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=str(REPO), timeout=10).stdout.strip() or None
    except Exception:
        return None


# ---------------------------------------------------------------- arbiter process
class ArbiterProcess:
    """A ``horovod-prio arbiter`` subprocess bound to ``host`` (port chosen by the OS).

    ``netns``: run it (and ``stats()``) inside that network namespace
    (``ip netns exec``); ``cpus``: a taskset CPU list. The secret is read from
    ``secret_file`` (never passed on a command line). ``start()`` returns
    ``host:port`` once the arbiter prints that it listens; ``stop()`` sends
    SIGTERM, then SIGKILL, to its process group."""

    def __init__(self, host: str, secret_file: Path, credit: str | int, starvation_bound: int,
                 log_path: Path, cpus: str | None = None, order: str = "burst",
                 netns: str | None = None, extra_args: list[str] | None = None):
        self.host, self.secret_file, self.netns = host, secret_file, netns
        self.argv = (self.prefix() + (["taskset", "-c", str(cpus)] if cpus else [])
                     + [sys.executable, "-m", "horovod_prio.cli", "arbiter",
                        "--bind", f"{host}:0", "--secret-file", str(secret_file),
                        "--credit-bytes", str(credit), "--starvation-bound", str(starvation_bound),
                        "--order", order] + list(extra_args or []))
        self.log_path = log_path
        self.proc = None
        self.address = None
        self._log = None

    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns] if self.netns else []

    def _env(self) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = f"{REPO}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(REPO)
        return env

    def start(self, timeout=30.0) -> str:
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, env=self._env(), cwd=str(REPO),
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=0.2):
                line = self.proc.stdout.readline()
                m = re.search(r"listening on (\S+):(\d+)", line or "")
                if m:
                    self.address = f"{m.group(1)}:{m.group(2)}"
                    return self.address
                if not line and self.proc.poll() is not None:
                    break
        raise HarnessError(f"arbiter did not start ({' '.join(self.argv)}); see {self.log_path}")

    def stats(self) -> dict | None:
        """The arbiter's counters (``--stats``), or None if it did not answer."""
        p = subprocess.run(self.prefix() + [sys.executable, "-m", "horovod_prio.cli", "arbiter",
                                            "--stats", self.address,
                                            "--secret-file", str(self.secret_file)],
                           capture_output=True, text=True, env=self._env(), cwd=str(REPO),
                           timeout=30)
        try:
            return json.loads(p.stdout) if p.returncode == 0 else None
        except ValueError:
            return None

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None
