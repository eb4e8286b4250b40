"""Horovod / horovod_prio jobs on the multi-host testbed (``benchmarks.testbed``).

    sudo .venv/bin/python -m benchmarks.cluster --job arb --job arb --variants hvd,prio,spec
    sudo .venv/bin/python -m benchmarks.cluster --job arb,class=0 --job arb,class=1
    sudo .venv/bin/python -m benchmarks.cluster --job prio,steps=80 --job prio,start=15,steps=30
    sudo .venv/bin/python -m benchmarks.cluster --report-only --out DIR

Every job has 2 ranks: rank 0 on host a<i> (rack A), rank 1 on host b<i>
(rack B), so its allreduce crosses the one tbf-shaped uplink between the
racks (both directions shaped, ``--rate``). Jobs are launched from the host
``head`` with a real ``horovodrun --gloo|--mpi -np 2 -H a<i>:1,b<i>:1
--network-interface eth0``, which reaches the hosts through the testbed's ssh
shim; the training script is ``benchmarks/workload.py``. The arbiter, when a
job asks for it, runs on the host ``arbiter`` (rack A, like every rank 0, so
its messages never queue on the uplink).

--job SPEC (repeatable; job i = the i-th; default two ``prio`` jobs) is a
comma-separated list: an implementation first -- ``horovod``, ``prio``
(horovod_prio alone) or ``arb`` (horovod_prio asking the arbiter) -- then any of
``class=N`` (HOROVOD_PRIO_JOB_PRIORITY, the job's class at the arbiter; arb
only), ``start=S`` (released S seconds after the other jobs' common start: a
job joining later), ``steps=N``, ``batch=N``, ``model=`` one of --model's choices,
``overlap`` (``model = hvd.overlap(model)``: barrier crossing; prio/arb only, kept
in the ``prio`` variant) and ``HOROVOD_PRIO_<X>=V`` (extra environment of a
prio/arb job).

--variants: which versions of that job list run, side by side in the same
invocation (repeats interleaved, order rotated each repeat): ``hvd`` = every
job plain Horovod (always run: the baseline of every ratio), ``prio`` = arb
jobs without the arbiter (class dropped), ``spec`` = as given. Identical
variants are run once.

Recorded per run (``OUT/results.json``): per-job per-step wall times (rank
0), the uplink's tc byte counters in both directions and every host's veth
counters every ``--sample-interval`` s, the arbiter's ``--stats`` at the
common start and at the end, per-job grant waits from the rank-0 traces
(``HOROVOD_PRIO_TRACE`` spans "arbiter <chunk>"), the horovod_prio logger
events (boost raise/decay), the ssh shim's invocations, the topology, the
command, git commit and 1-min load. ``OUT/results.md`` holds the tables,
``steps.png`` / ``link.png`` / ``boost.png`` the plots.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from horovod_prio.method import units
from horovod_prio.sim.scenarios import recovery_steps

from .models import HARNESS_MODELS
from . import netns, report, testbed
from .harness import (REPO, ArbiterProcess, JobSpec, Progress, RunFailed, check_prio_available,
                      git_rev, horovodrun_path, job_env, positive_int, preflight, rate_arg,
                      run_all, run_jobs, workload_command)
from .netns import HarnessError
from .testbed import LinkSampler, Testbed, plan_topology
from .traces import trace_summary

IMPLS = ("horovod", "prio", "arb")
SHORT = {"horovod": "hvd", "prio": "prio", "arb": "arb"}
VARIANTS = ("hvd", "prio", "spec")
LINK_NAME = "uplink"
#: set by the runner for arb jobs; a --job spec may not set them
RESERVED_ENV = ("HOROVOD_PRIO_ARBITER", "HOROVOD_PRIO_LINK", "HOROVOD_PRIO_JOB_ID",
                "HOROVOD_PRIO_ARBITER_SECRET", "HOROVOD_PRIO_ARBITER_SECRET_FILE",
                "HOROVOD_PRIO_JOB_PRIORITY")
MAX_START = 500.0       # workload.py waits at most 600 s for its go file


# ---------------------------------------------------------------- job specs
def parse_job(s: str) -> dict:
    """``"arb,class=1,start=10,HOROVOD_PRIO_CREDIT_BYTES=32MiB"`` -> a job dict."""
    d = {"impl": None, "class": None, "start": 0.0, "steps": None, "batch": None,
         "model": None, "overlap": False, "env": {}}
    toks = [t.strip() for t in str(s).split(",")]
    if not any(toks):
        raise argparse.ArgumentTypeError("empty job spec: expected e.g. prio or arb,class=1")
    for i, tok in enumerate(toks):
        if not tok:
            continue
        if "=" not in tok:
            if i == 0 and tok in IMPLS:
                d["impl"] = tok
                continue
            if i > 0 and tok == "overlap":
                d["overlap"] = True
                continue
            raise argparse.ArgumentTypeError(
                f"job spec {s!r}: {tok!r} is not key=value (the implementation, first, is one "
                f"of {', '.join(IMPLS)})")
        k, v = tok.split("=", 1)
        try:
            if k == "impl":
                if v not in IMPLS:
                    raise ValueError(f"expected one of {', '.join(IMPLS)}")
                d["impl"] = v
            elif k == "class":
                d["class"] = units.parse_int(v)
            elif k == "start":
                x = float(v)
                if not 0 <= x <= MAX_START:
                    raise ValueError(f"expected seconds in [0, {MAX_START:.0f}]")
                d["start"] = x
            elif k in ("steps", "batch"):
                x = units.parse_int(v)
                if x < 1:
                    raise ValueError("expected an integer >= 1")
                d[k] = x
            elif k == "model":
                if v not in HARNESS_MODELS:
                    raise ValueError(f"expected one of {', '.join(HARNESS_MODELS)}")
                d["model"] = v
            elif k.startswith("HOROVOD_PRIO_"):
                if k in RESERVED_ENV:
                    raise ValueError("set by the runner (use class= for the job class)")
                d["env"][k] = v
            else:
                raise ValueError("unknown key (impl, class, start, steps, batch, model, "
                                 "overlap, HOROVOD_PRIO_*)")
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"job spec {s!r}: {k}={v!r}: {e}") from None
    if d["impl"] is None:
        raise argparse.ArgumentTypeError(
            f"job spec {s!r}: the implementation ({', '.join(IMPLS)}) must come first")
    if d["class"] is not None and d["impl"] != "arb":
        raise argparse.ArgumentTypeError(
            f"job spec {s!r}: class= is the job's class at the arbiter: only with arb")
    if d["env"] and d["impl"] == "horovod":
        raise argparse.ArgumentTypeError(
            f"job spec {s!r}: HOROVOD_PRIO_* settings need a prio or arb job")
    if d["overlap"] and d["impl"] == "horovod":
        raise argparse.ArgumentTypeError(
            f"job spec {s!r}: overlap is hvd.overlap, horovod_prio's: needs a prio or arb job")
    return d


def variant_jobs(specs: list[dict], variant: str) -> list[dict]:
    """The job list of one variant (see --variants)."""
    out = []
    for d in specs:
        d = dict(d, env=dict(d["env"]))
        if variant == "hvd":
            d.update(impl="horovod", env={}, overlap=False, **{"class": None})
        elif variant == "prio" and d["impl"] == "arb":
            d.update(impl="prio", **{"class": None})
        out.append(d)
    return out


def job_label(d: dict) -> str:
    s = SHORT[d["impl"]]
    if d.get("class") is not None:
        s += f"(c{d['class']})"
    if d.get("overlap"):
        s += "+ov"
    if d.get("start"):
        s += f"@{d['start']:g}s"
    return s


def variants_to_run(specs: list[dict], wanted: list[str]) -> list[str]:
    """``hvd`` first, then the wanted variants whose job lists differ from all before."""
    out, seen = [], []
    for v in ["hvd"] + [w for w in wanted if w != "hvd"]:
        jl = variant_jobs(specs, v)
        if jl in seen:
            continue
        seen.append(jl)
        out.append(v)
    return out


# ---------------------------------------------------------------- arguments
def _variants(s):
    xs = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in xs if x not in VARIANTS]
    if bad or not xs:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(VARIANTS)}, got {s!r}")
    return xs


def _interval(s):
    try:
        x = float(s)
    except ValueError:
        x = -1
    if not 0.02 <= x <= 5:
        raise argparse.ArgumentTypeError(f"expected seconds in [0.02, 5], got {s!r}")
    return x


_size = units.arg(units.parse_bytes, 1)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", type=parse_job, action="append", default=None, metavar="SPEC",
                   help="one job (repeatable; default: --job prio --job prio)")
    p.add_argument("--variants", type=_variants, default=["hvd", "spec"],
                   help="hvd,prio,spec (default hvd,spec; hvd always runs)")
    transport = p.add_mutually_exclusive_group()
    transport.add_argument("--gloo", dest="transport", action="store_const", const="gloo",
                           help="horovodrun --gloo (default)")
    transport.add_argument("--mpi", dest="transport", action="store_const", const="mpi",
                           help="horovodrun --mpi (Open MPI, rsh agent = the ssh shim)")
    p.set_defaults(transport="gloo")
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--rate", type=rate_arg, default="1gbit",
                   help="tbf rate of the uplink, each direction (default 1gbit)")
    p.add_argument("--burst", default="1mb", help="tbf burst (default 1mb)")
    p.add_argument("--latency", default="50ms", help="tbf latency (default 50ms)")
    p.add_argument("--model", choices=HARNESS_MODELS, default="mlp")
    p.add_argument("--batch", type=positive_int, default=512, help="per-rank batch (default 512)")
    p.add_argument("--steps", type=positive_int, default=20, help="measured steps per job")
    p.add_argument("--warmup", type=positive_int, default=3)
    p.add_argument("--threads", type=positive_int, default=1, help="TF threads per rank")
    p.add_argument("--inter-threads", type=positive_int, default=None,
                   help="TF inter-op threads per rank, every variant (default: --threads)")
    p.add_argument("--pin", choices=["job", "rack", "none"], default="job",
                   help="job: both hosts of job i on core i%%ncpu (default; jobs share only the "
                        "uplink); rack: rack A hosts on core 0, rack B on core 1; none")
    p.add_argument("--arbiter-credit", type=_size, default="8MiB",
                   help="arbiter --credit-bytes (default 8MiB, one job's local credit)")
    p.add_argument("--arbiter-order", choices=["burst", "chunk"], default="burst")
    p.add_argument("--arbiter-class-reserve", type=units.arg(units.parse_class_reserve), default=0.0, metavar="F",
                   help="arbiter --class-reserve (default 0 = off, its default)")
    p.add_argument("--starvation-bound", type=int, default=8)
    p.add_argument("--subnet", default="10.77.0.0/16",
                   help="the testbed's addresses (private, /16 or larger; default 10.77.0.0/16)")
    p.add_argument("--sample-interval", type=_interval, default=0.1,
                   help="seconds between uplink counter samples (default 0.1)")
    p.add_argument("--job-timeout", type=positive_int, default=600)
    p.add_argument("--stall-timeout", type=positive_int, default=60)
    p.add_argument("--out", default=str(REPO / "results" / "cluster" / "latest"))
    p.add_argument("--keep-raw", action="store_true",
                   help="keep per-run logs, traces and the arbiter log under OUT/raw")
    p.add_argument("--report-only", action="store_true",
                   help="no runs: re-render OUT/results.md and the plots from OUT/results.json")
    return p


def parse_args(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    if a.job is None:
        a.job = [parse_job("prio"), parse_job("prio")]
    if len(a.job) > 8:
        p.error(f"argument --job: at most 8 jobs (got {len(a.job)})")
    if a.starvation_bound < 0:
        p.error(f"argument --starvation-bound: expected >= 0, got {a.starvation_bound}")
    try:
        plan_topology(["a1"], ["b1"], rate=a.rate, burst=a.burst, latency=a.latency,
                      subnet=a.subnet, tag="check")
    except ValueError as e:
        flag = next((f for f in ("burst", "latency", "subnet") if f in str(e)), "subnet")
        p.error(f"argument --{flag}: {e}")
    if not any(j["start"] == 0 for j in a.job):
        p.error("argument --job: at least one job must start at once (start=0)")
    for j in a.job:
        for k in ("steps", "batch", "model"):
            if j[k] is None:
                j[k] = getattr(a, k)
    return a


# ---------------------------------------------------------------- topology and jobs
def host_names(n_jobs: int) -> tuple[list[str], list[str]]:
    return [f"a{i + 1}" for i in range(n_jobs)], [f"b{i + 1}" for i in range(n_jobs)]


def host_cpus(n_jobs: int, pin: str, ncpu: int | None = None) -> dict[str, str]:
    ncpu = ncpu or os.cpu_count() or 1
    ra, rb = host_names(n_jobs)
    if pin == "job":
        return {h: str(i % ncpu) for i in range(n_jobs) for h in (ra[i], rb[i])}
    if pin == "rack":
        return {**{h: "0" for h in ra}, **{h: str(1 % ncpu) for h in rb}}
    return {}


def make_topology(n_jobs: int, args, tag: str | None = None):
    ra, rb = host_names(n_jobs)
    return plan_topology(ra, rb, rate=args.rate, burst=args.burst, latency=args.latency,
                         subnet=args.subnet, cpus=host_cpus(n_jobs, args.pin), tag=tag)


@dataclass
class ClusterJob(JobSpec):
    hosts: tuple = ()              # (rack-A host, rack-B host)
    arbiter: bool = False          # joins the arbiter
    job_class: int | None = None   # HOROVOD_PRIO_JOB_PRIORITY


def make_jobs(descs: list[dict], args) -> list[ClusterJob]:
    ra, rb = host_names(len(descs))
    jobs = []
    for i, d in enumerate(descs):
        env = dict(d["env"]) if d["impl"] != "horovod" else {}
        jobs.append(ClusterJob(
            name=f"job{i}", impl="horovod" if d["impl"] == "horovod" else "prio",
            model=d["model"], batch=d["batch"], steps=d["steps"], warmup=args.warmup,
            threads=args.threads, inter_threads=args.inter_threads, env=env, start=d["start"],
            extra_args=["--overlap"] if d.get("overlap") and d["impl"] != "horovod" else [],
            hosts=(ra[i], rb[i]),
            arbiter=d["impl"] == "arb", job_class=d.get("class")))
    return jobs


def cluster_job_command(job: ClusterJob, workdir: Path, transport: str = "gloo") -> list[str]:
    """``horovodrun`` of one job, run on ``head``: rank 0 on hosts[0], rank 1 on hosts[1]."""
    cmd = [horovodrun_path(), f"--{transport}", "-np", "2",
           "-H", f"{job.hosts[0]}:1,{job.hosts[1]}:1", "--network-interface", "eth0",
           "--start-timeout", "120"]
    if transport == "gloo":
        cmd += ["--gloo-timeout-seconds", "120"]
    return cmd + workload_command(job, workdir)


def arbiter_env(job: ClusterJob, address: str, secret_file: Path) -> dict:
    """What an arb job gets to reach the arbiter (the secret as a file, never on a
    command line: Gloo's launcher passes the environment on the ssh command)."""
    if not job.arbiter:
        return {}
    env = {"HOROVOD_PRIO_ARBITER": address, "HOROVOD_PRIO_LINK": LINK_NAME,
           "HOROVOD_PRIO_ARBITER_SECRET_FILE": str(secret_file), "HOROVOD_PRIO_JOB_ID": job.name}
    if job.job_class is not None:
        env["HOROVOD_PRIO_JOB_PRIORITY"] = str(job.job_class)
    return env


def cluster_job_env(job: ClusterJob, workdir: Path, tb: Testbed) -> dict:
    return tb.launch_env(job_env(job, workdir))


class HeadLauncher:
    """What ``harness.run_jobs`` needs from a launcher: every job's horovodrun on
    the host ``head``; ``bytes_sent`` = the uplink's two directions together."""

    def __init__(self, tb: Testbed):
        self.tb = tb

    def popen(self, argv, cpus=None, **kw):
        return self.tb.popen("head", argv, cpus=cpus, **kw)

    def bytes_sent(self) -> int:
        u = self.tb.uplink_bytes()
        return u["AB"] + u["BA"]

    def kill_processes(self):
        self.tb.kill_processes()


def topology_record(topo) -> dict:
    return {"rate": topo.rate, "burst": topo.burst, "latency": topo.latency,
            "uplink": {"AB": topo.uplink[0], "BA": topo.uplink[1]}, "fabric": topo.fabric,
            "hosts": [{"name": h.name, "rack": h.rack, "address": h.address,
                       "cpus": h.cpus, "netns": h.netns} for h in topo.hosts]}


# ---------------------------------------------------------------- one run
def plan(variants: list[str], repeats: int) -> list[dict]:
    runs = []
    for rep in range(repeats):
        k = rep % len(variants)
        for v in variants[k:] + variants[:k]:
            runs.append({"variant": v, "repeat": rep})
    return runs


def execute_run(r: dict, args, workroot: Path, secret_file: Path,
                progress: Progress | None) -> dict:
    descs = variant_jobs(args.job, r["variant"])
    label = f"{r['variant']}-r{r['repeat']}"
    workdir = workroot / label
    workdir.mkdir(parents=True, exist_ok=True)
    jobs = make_jobs(descs, args)
    rec = dict(r, label=label, status="ok", error=None, rate=args.rate,
               transport=args.transport, job_specs=descs,
               config=[job_label(d) for d in descs], loadavg_before=os.getloadavg()[0])
    topo = make_topology(len(jobs), args)
    tb = Testbed(topo)
    arb = sampler = None
    stats_thread = None
    try:
        tb.create()
        rec["topology"] = topology_record(topo)
        rec["qdisc"] = netns.run_cmd(["tc", "-n", topo.fabric, "qdisc", "show"],
                                     check=False).stdout.strip()
        if any(j.arbiter for j in jobs):
            ah = topo.host("arbiter")
            arb = ArbiterProcess(ah.address, secret_file, args.arbiter_credit,
                                 args.starvation_bound, workdir / "arbiter.log",
                                 order=args.arbiter_order, netns=ah.netns,
                                 extra_args=["--class-reserve", repr(args.arbiter_class_reserve)])
            rec["arbiter_address"] = arb.start()
            for j in jobs:
                j.env.update(arbiter_env(j, arb.address, secret_file))
        sampler = LinkSampler(tb, args.sample_interval).start()

        def on_go(t_go):
            nonlocal stats_thread
            if arb is not None:
                stats_thread = threading.Thread(
                    target=lambda: rec.__setitem__("arbiter_stats_go", arb.stats()), daemon=True)
                stats_thread.start()

        rec.update(run_jobs(HeadLauncher(tb), jobs, workdir, args.job_timeout, progress,
                            stall_timeout=args.stall_timeout, on_go=on_go,
                            command=lambda j, w: cluster_job_command(j, w, args.transport),
                            env=lambda j, w: cluster_job_env(j, w, tb)))
        if stats_thread is not None:
            stats_thread.join(timeout=30)
        if arb is not None:
            rec["arbiter_stats_end"] = arb.stats()
        for jr, j in zip(rec["jobs"], jobs):
            jr.update(hosts=list(j.hosts), arbiter=j.arbiter, job_class=j.job_class,
                      start=j.start, label=job_label(descs[int(j.name[3:])]))
        add_trace_fields(rec, workdir)
    except (RunFailed, HarnessError) as e:
        rec["status"], rec["error"] = "failed", str(e)
    finally:
        if sampler is not None:
            rec["uplink_samples"] = sampler.stop()
        rec["shim"] = [{"t": t, "host": h, "command": c[:120]} for t, h, c in tb.shim_log()]
        rec["loadavg_after"] = os.getloadavg()[0]
        try:
            tb.kill_processes()
        finally:
            if arb is not None:
                arb.stop()
            tb.cleanup()
    return rec


def add_trace_fields(rec: dict, workdir: Path) -> None:
    """Per-job arbiter grant waits over the job's measured steps (rank-0 trace)."""
    waits = {}
    for j in rec.get("jobs", []):
        tp = workdir / f"{j['name']}.trace.json"
        st = report.measured_steps(j)
        if j.get("impl") == "prio" and tp.exists() and st:
            waits[j["name"]] = trace_summary(tp, (st[0][0], st[-1][1] + 0.01))
    rec["arbiter_waits"] = waits


# ---------------------------------------------------------------- statistics
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
    idx = {k: i for i, k in enumerate(testbed.CPU_FIELDS)}
    out = {}
    for cpu in sorted(samples[0]["cpu"], key=_core_order):
        def field(name, cpu=cpu):
            return lambda s: (s["cpu"].get(cpu) or [None] * len(idx))[idx[name]]

        d = {}
        for name in testbed.CPU_FIELDS:
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


def run_stats(rec: dict) -> dict:
    """Per job: median s/step over all measured steps, while every job was
    measuring ("shared"), and outside that window ("alone"); the shared window;
    uplink usage over it; comm floor."""
    jobs = rec.get("jobs", [])
    steps = [report.measured_steps(j) for j in jobs]
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
        pol = report.policy_series(j)
        # ran alone before the join: at least one whole step before the others
        # measured (jobs started together begin a few ms apart; that is no join)
        first = bool(win and any(e <= win[0] + 1e-6 for _, e in st))
        rec_steps = None
        if first and d_al:
            rec_steps = recovery_steps([(s, e - s) for s, e in st], win[0] - 1e-6,
                                       report.median(d_al))
        out["jobs"].append({
            "name": j["name"], "label": j.get("label"), "impl": j.get("impl"),
            "n": len(d_all), "median": report.median(d_all),
            "n_shared": len(d_sh), "median_shared": report.median(d_sh),
            "n_alone": len(d_al), "median_alone": report.median(d_al),
            "recovery": rec_steps, "ran_first": first,
            "max_boost": max((b for _, _, b in pol if b is not None), default=None),
            "raises": sum(1 for _, k in report.job_events(j) if k == "raise")})
    shared = [x["median_shared"] for x in out["jobs"]]
    out["mean_shared"] = statistics.fmean(shared) if shared and None not in shared else None
    span = win
    if span is None and any(steps):
        span = (min(s[0][0] for s in steps if s), max(s[-1][1] for s in steps if s))
    out["uplink"] = uplink_usage(rec, *span) if span else None
    out["cores"] = core_usage(rec, *span) if span else None
    meta = (jobs[0].get("meta") or {}) if jobs else {}
    gb = meta.get("grad_bytes")
    # ring allreduce of 2 ranks: each rank sends S, i.e. S per direction of the uplink
    out["floor"] = (len(jobs) * gb * 8 / units.parse_rate_bits_per_s(rec["rate"])) if gb else None
    return out


def _grants(rec: dict) -> tuple[float | None, float | None]:
    """(grants, grants that waited) on the uplink link between the go and the end."""
    a, b = rec.get("arbiter_stats_go"), rec.get("arbiter_stats_end")
    if not b:
        return None, None
    lb = (b.get("links") or {}).get(LINK_NAME) or {}
    la = ((a or {}).get("links") or {}).get(LINK_NAME) or {}
    g = lb.get("grants", 0) - la.get("grants", 0)
    w = lb.get("waits", 0) - la.get("waits", 0)
    return g, w


def summarize(results: dict) -> tuple[list[dict], list[dict]]:
    """(rows per variant, rows per variant x job), medians over repeats; ratios
    against the hvd run of the same repeat."""
    runs = [r for r in results.get("runs", [])]
    stats = {(r["variant"], r["repeat"]): run_stats(r) for r in runs if r.get("status") == "ok"}
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
        row["job_s"] = [report.median([s["jobs"][i]["median_shared"] for s in st])
                        for i in range(njobs)]
        row["mean_s"] = report.median([s["mean_shared"] for s in st])
        row["floor_s"] = report.median([s["floor"] for s in st])
        for d in ("AB", "BA"):
            row[f"busy_{d}"] = report.median([(s["uplink"] or {}).get(d) for s in st])
        cores = sorted({c for x in st for c in (x.get("cores") or {})}, key=_core_order)
        row["cores"] = {c: {k: report.median([((x.get("cores") or {}).get(c) or {}).get(k)
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
        row["speedup"] = report.median(sp)
        row["speedup_range"] = (min(sp), max(sp)) if len(sp) > 1 and v != "hvd" else None
        row["worst_job_change"] = report.median(worst)
        waits = []
        for r in ok:
            s = stats[(v, r["repeat"])]
            for j in s["jobs"]:
                w = (r.get("arbiter_waits") or {}).get(j["name"])
                if w and w.get("chunks") and j["n"]:
                    waits.append(w.get("wait_union_s", w["wait_total_s"]) / j["n"])
        row["wait_per_step_s"] = report.median(waits)
        gw = [_grants(r) for r in ok if r.get("arbiter_stats_end")]
        if gw:
            row["grants"] = report.median([g for g, _ in gw])
            row["grants_waited"] = report.median([w for _, w in gw])
        for i in range(njobs):
            js = [s["jobs"][i] for s in st]
            shares = [((s["uplink"] or {}).get("share") or {}).get(js[0]["name"]) for s in st]
            jrows.append({
                "variant": v, "job": js[0]["name"], "label": js[0]["label"],
                "median": report.median([x["median"] for x in js]),
                "median_shared": report.median([x["median_shared"] for x in js]),
                "median_alone": report.median([x["median_alone"] for x in js]),
                "vs_hvd": report.median(per_job_ratio[i]),
                "share": report.median(shares),
                "max_boost": max((x["max_boost"] for x in js if x["max_boost"] is not None),
                                 default=None),
                "raises": report.median([x["raises"] for x in js]),
                "recovery": [x["recovery"] for x in js] if js[0]["ran_first"] else None})
    return rows, jrows


# ---------------------------------------------------------------- report
def markdown(results: dict) -> str:
    meta = results.get("meta", {})
    f = report.fmt
    rows, jrows = summarize(results)
    jobs = "; ".join(
        f"{job_label(d)} {d.get('model')} batch {d.get('batch')}/rank {d.get('steps')} steps"
        + (f" {' '.join(f'{k}={v}' for k, v in d['env'].items())}" if d.get("env") else "")
        for d in meta.get("jobs", []))
    lines = [
        f"Command: `{meta.get('command')}` — {meta.get('date')}, git {meta.get('git')}, "
        f"{meta.get('ncpu')} cores, transport {meta.get('transport')}, uplink {meta.get('rate')} "
        f"each way, {meta.get('warmup')} warmup steps, repeats={meta.get('repeats')}, "
        f"pin={meta.get('pin')}, jobs: {jobs}",
        "",
        "| variant | jobs | job s/step (shared window) | mean s/step | comm floor s/step "
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
            f"| {f(r['mean_s'])} | {f(r['floor_s'])} | {report.ratio_cell(r['speedup'], r.get('speedup_range'))} "
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
    lines += report.notes_and_load(results, meta)
    lines += ["", "Shared window: while every job was measuring (warmup excluded; a job with "
              "start=S is released S s after the others). s/step: median over repeats of each "
              "job's median step time; 'alone' = its measured steps outside the shared window. "
              "speedup: hvd mean s/step ÷ this variant's, same repeat, median over repeats "
              "(in brackets: the lowest and highest per-repeat ratio); "
              "vs hvd (same job): hvd job's s/step ÷ this job's. comm floor: every rank sends S "
              "(gradient bytes) across the uplink per step, each direction carries S per job: "
              "jobs × S·8/rate. uplink busy: tc bytes sent by the tbf of each uplink end ÷ "
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


def plot(results: dict, out: Path) -> list[Path]:
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
            st = report.measured_steps(j)
            ys = [e - s for s, e in st]
            ymax = max([ymax] + ys)
            ax.plot([e - t0 for _, e in st], ys, ".-", color=colors[i % 8], lw=1, ms=3,
                    label=f"{j['name']} {j.get('label') or j.get('impl')}")
        for i, j in enumerate(r["jobs"]):
            for t, k in report.job_events(j):
                ax.plot([t - t0], [ymax * (1.08 if k == "raise" else 1.02)],
                        "^" if k == "raise" else "v", color=colors[i % 8], ms=5)
        win = run_stats(r)["window"]
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
        spans = [report.measured_steps(j) for j in r["jobs"]]
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
            end = max((report.measured_steps(j)[-1][1] for j in r["jobs"]
                       if report.measured_steps(j)), default=t0) - t0
            for i, j in enumerate(r["jobs"]):
                if j.get("impl") != "prio":
                    continue
                pts = [(t - t0, b) for t, _, b in report.policy_series(j) if b is not None]
                xs, ys = [min([0.0] + [x for x, _ in pts])], [0]
                for x, b in pts:
                    xs.append(x)
                    ys.append(b)
                xs.append(max(end, xs[-1]))
                ys.append(ys[-1])
                ax.step(xs, [y + 0.04 * i for y in ys], where="post", color=colors[i % 8],
                        label=f"{j['name']} {j.get('label') or ''}")
            top = max([1] + [b for j in r["jobs"] for _, _, b in report.policy_series(j)
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


def dump_results(results: dict) -> str:
    """results.json text: the meta indented, then one compact line per run (a run
    holds thousands of counter samples)."""
    rest = {k: v for k, v in results.items() if k not in ("meta", "runs")}
    head = json.dumps({"meta": results.get("meta", {}), **rest}, indent=1)
    runs = ",\n".join(json.dumps(r, separators=(",", ":")) for r in results.get("runs", []))
    return head[:-2] + ',\n "runs": [\n' + runs + "\n]\n}\n"


def write_report(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(dump_results(results))
    (out / "results.md").write_text(markdown(results) + "\n")
    try:
        plot(results, out)
    except Exception as e:          # plotting is a convenience, never fail the benchmark
        sys.stderr.write(f"[cluster] plot failed: {e}\n")


def report_only(out: Path) -> int:
    results = json.loads((out / "results.json").read_text())
    write_report(results, out)
    sys.stdout.write(markdown(results) + "\n")
    return 0


# ---------------------------------------------------------------- main
def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.report_only:
        return report_only(out)
    if not preflight("cluster"):
        return 2
    removed = testbed.cleanup_stale()
    if removed:
        sys.stderr.write(f"[cluster] removed stale testbed namespaces: {', '.join(removed)}\n")
    variants = variants_to_run(args.job, args.variants)
    if any(d["impl"] != "horovod" for v in variants for d in variant_jobs(args.job, v)):
        sys.stderr.write("[cluster] checking horovod_prio.tensorflow.keras ...\n")
        ok, why = check_prio_available()
        if not ok:
            sys.stderr.write(f"[cluster] error: horovod_prio binding unavailable ({why})\n")
            return 2
    workroot = Path(tempfile.mkdtemp(prefix="hprio-cluster-"))
    secret_file = workroot / "secret"
    secret_file.write_text(secrets.token_urlsafe(32))
    os.chmod(secret_file, 0o600)
    runs = plan(variants, args.repeats)
    progress = Progress(len(runs), tag="cluster")
    results = {"meta": {
        "command": "python -m benchmarks.cluster " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git": git_rev(), "ncpu": os.cpu_count(), "loadavg": list(os.getloadavg()),
        "transport": args.transport, "rate": args.rate, "burst": args.burst,
        "latency": args.latency, "model": args.model, "batch": args.batch,
        "steps": args.steps, "warmup": args.warmup, "threads": args.threads,
        "inter_threads": args.inter_threads or args.threads, "pin": args.pin,
        "repeats": args.repeats, "variants": variants, "jobs": args.job,
        "arbiter_credit": args.arbiter_credit, "arbiter_order": args.arbiter_order,
        "starvation_bound": args.starvation_bound, "subnet": args.subnet,
        "arbiter_class_reserve": args.arbiter_class_reserve,
        "sample_interval": args.sample_interval, "link": LINK_NAME,
    }, "runs": []}
    stopped, failed = run_all(
        runs, results, out, workroot, progress, keep_raw=args.keep_raw, tag="cluster",
        write=write_report, raw_ignore=shutil.ignore_patterns("secret"),
        describe=lambda r: (f"{r['variant']}: "
                            f"{' + '.join(job_label(d) for d in variant_jobs(args.job, r['variant']))}"
                            f" (repeat {r['repeat'] + 1}/{args.repeats})"),
        execute=lambda r: execute_run(r, args, workroot, secret_file, progress))
    if stopped is not None:
        return stopped
    sys.stdout.write(markdown(results) + "\n")
    sys.stderr.write(f"[cluster] wrote {out}/results.json, results.md, steps.png, link.png, "
                     "boost.png\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
