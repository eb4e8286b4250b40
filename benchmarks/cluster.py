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
only), ``nice=N`` (every thread of the job at nice N, -20..19, in every variant:
HOROVOD_PRIO_CPU_NICE for prio/arb, the workload's ``--nice`` for plain Horovod),
``start=S`` (released S seconds after the other jobs' common start: a job joining
later), ``steps=N``, ``batch=N``, ``model=`` one of --model's choices,
``overlap`` (``model = hvd.overlap(model)``: barrier crossing; prio/arb only, kept
in the ``prio`` variant) and ``HOROVOD_PRIO_<X>=V`` (extra environment of a
prio/arb job).

--variants: which versions of that job list run, side by side in the same
invocation (repeats interleaved, order rotated each repeat): ``hvd`` = every
job plain Horovod (always run: the baseline of every ratio), ``prio`` = arb
jobs without the arbiter (class dropped), ``spec`` = as given. Identical
variants are run once.

Recorded per run (``OUT/results.json.gz``, see ``benchmarks.results_io``): per-job per-step wall times (rank
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
import os
import secrets
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from horovod_prio.arbiter.core import DEFAULT_CLASS_RESERVE
from horovod_prio.method import units

from .models import HARNESS_MODELS
from . import netns, report, results_io, testbed
from .harness import (REPO, ArbiterProcess, JobSpec, Progress, RunFailed, check_prio_available,
                      git_rev, horovodrun_path, job_env, positive_int, preflight, rate_arg,
                      run_all, run_jobs, workload_command)
from .netns import HarnessError
from .cgroups import host_kind_arg
from .testbed import LinkSampler, Testbed, plan_topology
from .traces import trace_summary

IMPLS = ("horovod", "prio", "arb")
VARIANTS = ("hvd", "prio", "spec")
LINK_NAME = "uplink"
#: set by the runner for arb jobs; a --job spec may not set them
RESERVED_ENV = {"HOROVOD_PRIO_ARBITER": "", "HOROVOD_PRIO_LINK": "", "HOROVOD_PRIO_JOB_ID": "",
                "HOROVOD_PRIO_ARBITER_SECRET": "", "HOROVOD_PRIO_ARBITER_SECRET_FILE": "",
                "HOROVOD_PRIO_JOB_PRIORITY": " (use class= for the job class)",
                "HOROVOD_PRIO_CPU_NICE": " (use nice=: it then applies in every variant)"}
MAX_START = 500.0       # workload.py waits at most 600 s for its go file


# ---------------------------------------------------------------- job specs
def parse_job(s: str) -> dict:
    """``"arb,class=1,start=10,HOROVOD_PRIO_CREDIT_BYTES=32MiB"`` -> a job dict."""
    d = {"impl": None, "class": None, "start": 0.0, "steps": None, "batch": None,
         "model": None, "overlap": False, "nice": None, "env": {}}
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
            elif k == "nice":
                d["nice"] = units.parse_int(v, -20, 19)
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
                    raise ValueError("set by the runner" + RESERVED_ENV[k])
                d["env"][k] = v
            else:
                raise ValueError("unknown key (impl, class, nice, start, steps, batch, model, "
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
    p.add_argument("--arbiter-class-reserve", type=units.arg(units.parse_class_reserve), default=None,
                   metavar="F", help="arbiter --class-reserve (default: the arbiter's own)")
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
    p.add_argument("--host-kind", type=host_kind_arg, action="append", default=[],
                   metavar="HOST=KIND[,key=value...]",
                   help="give HOST (a1, b2, head, ...) a cgroup of KIND (large-memory, "
                        "more-cores, custom; keys cpu, period, weight, cpuset, memory; "
                        "see docs/testbed.md); repeatable")
    p.add_argument("--report-only", action="store_true",
                   help="no runs: re-render OUT/results.md and the plots from OUT/results.json.gz")
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
    known = sum(host_names(len(a.job)), ["head", "arbiter"])
    for host, _, _ in a.host_kind:
        if host not in known:
            p.error(f"argument --host-kind: no host {host!r} with {len(a.job)} jobs "
                    f"(hosts: {', '.join(known)})")
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
                         subnet=args.subnet, cpus=host_cpus(n_jobs, args.pin), tag=tag,
                         kinds={h: (k, lim) for h, k, lim in getattr(args, "host_kind", [])})


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
        extra = ["--overlap"] if d.get("overlap") and d["impl"] != "horovod" else []
        if d.get("nice") is not None:     # the product's knob; plain Horovod: the workload's
            if d["impl"] == "horovod":
                extra += ["--nice", str(d["nice"])]
            else:
                env["HOROVOD_PRIO_CPU_NICE"] = str(d["nice"])
        jobs.append(ClusterJob(
            name=f"job{i}", impl="horovod" if d["impl"] == "horovod" else "prio",
            model=d["model"], batch=d["batch"], steps=d["steps"], warmup=args.warmup,
            threads=args.threads, inter_threads=args.inter_threads, env=env, start=d["start"],
            extra_args=extra,
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
                       "cpus": h.cpus, "netns": h.netns, "kind": h.kind,
                       "limits": h.limits.describe() if h.limits else None}
                      for h in topo.hosts]}


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
               config=[report.cluster_job_label(d) for d in descs], loadavg_before=os.getloadavg()[0])
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
                                 extra_args=[] if args.arbiter_class_reserve is None else
                                 ["--class-reserve", repr(args.arbiter_class_reserve)])
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
                      start=j.start, label=report.cluster_job_label(descs[int(j.name[3:])]))
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


def write_report(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    results_io.save(out, results)
    (out / "results.md").write_text(report.cluster_markdown(results) + "\n")
    try:
        report.cluster_plot(results, out)
    except Exception as e:          # plotting is a convenience, never fail the benchmark
        sys.stderr.write(f"[cluster] plot failed: {e}\n")


def report_only(out: Path) -> int:
    results = results_io.load(out)
    write_report(results, out)
    sys.stdout.write(report.cluster_markdown(results) + "\n")
    return 0


def results_meta(args, variants: list[str], command: str) -> dict:
    """``results.json``'s meta of a run of ``args`` (what the report and
    ``benchmarks.sim_check`` read back)."""
    return {
        "command": command,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git": git_rev(), "ncpu": os.cpu_count(), "loadavg": list(os.getloadavg()),
        "transport": args.transport, "rate": args.rate, "burst": args.burst,
        "latency": args.latency, "model": args.model, "batch": args.batch,
        "steps": args.steps, "warmup": args.warmup, "threads": args.threads,
        "inter_threads": args.inter_threads or args.threads, "pin": args.pin,
        "repeats": args.repeats, "variants": variants, "jobs": args.job,
        "arbiter_credit": args.arbiter_credit, "arbiter_order": args.arbiter_order,
        "starvation_bound": args.starvation_bound, "subnet": args.subnet,
        "arbiter_class_reserve": DEFAULT_CLASS_RESERVE if args.arbiter_class_reserve is None
        else args.arbiter_class_reserve,
        "sample_interval": args.sample_interval, "link": LINK_NAME, "mtu": testbed.MTU,
    }


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
    results = {"meta": results_meta(args, variants, "python -m benchmarks.cluster " + " ".join(
        sys.argv[1:] if argv is None else argv)), "runs": []}
    stopped, failed = run_all(
        runs, results, out, workroot, progress, keep_raw=args.keep_raw, tag="cluster",
        write=write_report, raw_ignore=shutil.ignore_patterns("secret"),
        describe=lambda r: (f"{r['variant']}: "
                            f"{' + '.join(report.cluster_job_label(d) for d in variant_jobs(args.job, r['variant']))}"
                            f" (repeat {r['repeat'] + 1}/{args.repeats})"),
        execute=lambda r: execute_run(r, args, workroot, secret_file, progress))
    if stopped is not None:
        return stopped
    sys.stdout.write(report.cluster_markdown(results) + "\n")
    sys.stderr.write(f"[cluster] wrote {out}/results.json.gz, results.md, steps.png, link.png, "
                     "boost.png\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
