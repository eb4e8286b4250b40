"""Issue 5 benchmark: two jobs on one shaped link, with and without the arbiter.

    sudo .venv/bin/python -m benchmarks.arbiter_bench --repeats 3 \\
        --out results/bench/arbiter-2gbit-b512

Configs (each run: a fresh namespace from ``benchmarks.netns.ShapedLink``, two
jobs of 2 ranks each started by ``benchmarks.harness.run_jobs`` exactly as the
main harness does -- ``horovodrun --gloo --network-interface lo``, job j on
core j -- all crossing the namespace's tbf-shaped ``lo``):

  hvd   plain Horovod + plain Horovod                     (baseline)
  prio  horovod_prio + horovod_prio, no arbiter
  arb   horovod_prio + horovod_prio, both joined to one arbiter (--order chunk)
  burst horovod_prio + horovod_prio, both joined to one arbiter (--order burst)

The arbiter must not sit behind the shaped qdisc (its ~50-byte messages would
queue behind gradient bytes), so for every run a veth pair connects the
namespace to the host: ``--host-addr`` (default 169.254.77.1/30) on the host
end, ``--ns-addr`` (169.254.77.2/30) inside the namespace. The arbiter
(``benchmarks.harness.ArbiterProcess``) runs on the host, bound to the host end; the ``arb`` jobs get
``HOROVOD_PRIO_ARBITER=<host end>:<port>``, ``HOROVOD_PRIO_LINK=shared``,
``HOROVOD_PRIO_ARBITER_SECRET`` and ``HOROVOD_PRIO_JOB_ID=job0|job1``.
Horovod's own traffic stays on the shaped ``lo``. The veth is used only by
arbiter messages (it carries no gradient bytes, and the tbf counter used for
"link busy" is the one on ``lo``).

Repeats are interleaved with the config order rotated each repeat; ratios
(speedup of the mean step time, worst job's slowdown) are taken against the
``hvd`` run of the same repeat, then the median over repeats is reported.
Per run the arbiter's counters (``--stats``) and, from each prio job's
``HOROVOD_PRIO_TRACE``, the time its chunks waited for a grant are recorded.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import ipaddress
import os
import re
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

from horovod_prio.method import units

from .models import HARNESS_MODELS
from . import netns, report, results_io
from .harness import (REPO, ArbiterProcess, JobSpec, Progress, RunFailed, cpus_for, git_rev,
                      positive_int, preflight, prio_env_arg, rate_arg, run_all, run_jobs)
from .netns import HarnessError, ShapedLink
from .traces import inflight_fraction, spans, step_breakdown, trace_events, trace_summary

# name -> (job 0, job 1, arbiter order or None)
CONFIGS = {
    "hvd": ("horovod", "horovod", None),
    "prio": ("prio", "prio", None),
    "arb": ("prio", "prio", "chunk"),
    "burst": ("prio", "prio", "burst"),
}
LABELS = {"hvd": "hvd+hvd", "prio": "prio+prio", "arb": "prio+prio + arbiter",
          "burst": "prio+prio + arbiter, burst order"}
LINK_NAME = "shared"


# ---------------------------------------------------------------- arguments
def _configs(s):
    xs = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in xs if x not in CONFIGS]
    if bad or not xs:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(CONFIGS)}, got {s!r}")
    if len(set(xs)) != len(xs):
        raise argparse.ArgumentTypeError(f"duplicate config in {s!r}")
    return xs


def _iface(s):
    try:
        i = ipaddress.ip_interface(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an IPv4 address with prefix, e.g. "
                                         f"169.254.77.1/30, got {s!r}")
    if i.version != 4 or i.network.prefixlen == 32:
        raise argparse.ArgumentTypeError(f"expected an IPv4 address with a prefix < 32, got {s!r}")
    if not (i.ip.is_link_local or i.ip.is_loopback):
        raise argparse.ArgumentTypeError(
            f"{s!r}: only link-local (169.254.0.0/16) addresses are allowed for the veth pair "
            "(traffic must stay between our own namespaces)")
    return i


_size = units.arg(units.parse_bytes, 1)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.arbiter_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", type=_configs, default=["hvd", "prio", "arb", "burst"],
                   help="comma-separated subset of hvd,prio,arb,burst (default all four; "
                        "ratios need hvd)")
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--rate", type=rate_arg, default="2gbit",
                   help="tc tbf rate (default 2gbit: compute ~ comm for mlp batch 512)")
    p.add_argument("--model", choices=HARNESS_MODELS, default="mlp")
    p.add_argument("--batch", type=positive_int, default=512, help="per-rank batch (default 512)")
    p.add_argument("--steps", type=positive_int, default=20)
    p.add_argument("--warmup", type=positive_int, default=3)
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--pin", choices=["job", "none"], default="job")
    p.add_argument("--prio-env", type=prio_env_arg, action="append", default=[],
                   metavar="HOROVOD_PRIO_X=V", help="extra env for prio and arb jobs (repeatable)")
    p.add_argument("--arbiter-credit", type=_size, default="8MiB",
                   help="arbiter --credit-bytes (default 8MiB = one job's default local "
                        "credit, so the arbiter binds when both jobs send at once; with the "
                        "arbiter's own default 16MiB every request is granted on arrival)")
    p.add_argument("--starvation-bound", type=int, default=8)
    p.add_argument("--arbiter-timeout", type=float, default=None,
                   help="HOROVOD_PRIO_ARBITER_TIMEOUT for arb jobs (default: the binding's)")
    p.add_argument("--arbiter-cpus", default=None, metavar="LIST",
                   help="taskset CPU list for the arbiter process (default: unpinned)")
    p.add_argument("--host-addr", type=_iface, default=_iface("169.254.77.1/30"))
    p.add_argument("--ns-addr", type=_iface, default=_iface("169.254.77.2/30"))
    p.add_argument("--job-timeout", type=positive_int, default=400)
    p.add_argument("--stall-timeout", type=positive_int, default=40)
    p.add_argument("--out", default=str(REPO / "results" / "bench" / "arbiter"))
    p.add_argument("--keep-raw", action="store_true",
                   help="keep per-run logs and traces under OUT/raw")
    p.add_argument("--report-only", action="store_true",
                   help="no runs: re-render OUT/results.md (+ steps.png) from OUT/results.json.gz, "
                        "re-deriving the trace columns from OUT/raw when it exists")
    return p


def parse_args(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    if a.host_addr.network != a.ns_addr.network or a.host_addr.ip == a.ns_addr.ip:
        p.error(f"--host-addr {a.host_addr} and --ns-addr {a.ns_addr} must be two different "
                "addresses of the same subnet")
    if a.starvation_bound < 0:
        p.error(f"argument --starvation-bound: expected >= 0, got {a.starvation_bound}")
    if a.arbiter_cpus is not None and not re.fullmatch(r"\d+([-,]\d+)*", a.arbiter_cpus):
        p.error(f"argument --arbiter-cpus: expected a CPU list such as 1 or 0,1, "
                f"got {a.arbiter_cpus!r}")
    if a.arbiter_timeout is not None and a.arbiter_timeout <= 0:
        p.error(f"argument --arbiter-timeout: expected > 0, got {a.arbiter_timeout}")
    return a


# ---------------------------------------------------------------- veth + arbiter
def _ip(*argv, check=True):
    return netns.run_cmd(["ip", *argv], check=check)


class VethToHost:
    """veth pair: ``host_addr`` on the host, ``ns_addr`` inside ``link``'s namespace."""

    def __init__(self, link: ShapedLink, host_addr, ns_addr):
        self.link, self.host_addr, self.ns_addr = link, host_addr, ns_addr
        tag = f"{os.getpid() % 100000}"
        self.host_if, self.ns_if = f"hpab{tag}h", f"hpab{tag}n"
        self.up = False

    def create(self):
        out = _ip("-br", "addr").stdout
        if re.search(rf"\b{re.escape(str(self.host_addr.ip))}/", out):
            raise HarnessError(f"{self.host_addr.ip} is already configured on the host "
                               "(another arbiter benchmark running?); pick --host-addr/--ns-addr")
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        self.up = True
        _ip("link", "set", self.ns_if, "netns", self.link.name)
        _ip("addr", "add", str(self.host_addr), "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        ex = ["netns", "exec", self.link.name, "ip"]
        _ip(*ex, "addr", "add", str(self.ns_addr), "dev", self.ns_if)
        _ip(*ex, "link", "set", self.ns_if, "up")
        return self

    def cleanup(self):
        if self.up:
            _ip("link", "del", self.host_if, check=False)   # deletes the peer too
            self.up = False


def add_trace_fields(rec: dict, workdir: Path) -> None:
    """Trace-derived fields of one run (rank-0 traces of its prio jobs in ``workdir``)."""
    win = report.overlap_window(rec)
    traces = [workdir / f"{j['name']}.trace.json" for j in rec.get("jobs", [])
              if j.get("impl") == "prio"]
    traces = [t for t in traces if t.exists()]
    rec["arbiter_waits"] = {t.name.split(".")[0]: trace_summary(t, win) for t in traces}
    rec["breakdown"] = {t.name.split(".")[0]: step_breakdown(t, win) for t in traces}
    if traces and len(traces) == len(rec.get("jobs", [])):
        rec["chunks_inflight"] = inflight_fraction(traces, win)


# ---------------------------------------------------------------- plan / run
def plan(configs: list[str], repeats: int) -> list[dict]:
    runs = []
    for rep in range(repeats):
        k = rep % len(configs)
        for c in configs[k:] + configs[:k]:
            runs.append({"config_name": c, "repeat": rep})
    return runs


def execute_run(r: dict, args, workroot: Path, secret_file: Path, secret: str,
                progress: Progress | None) -> dict:
    impl0, impl1, with_arb = CONFIGS[r["config_name"]]
    label = f"{r['config_name']}-{args.rate}-b{args.batch}-r{r['repeat']}"
    workdir = workroot / label
    workdir.mkdir(parents=True, exist_ok=True)
    rec = dict(r, label=label, scenario="arb", rate=args.rate, batch=args.batch,
               config=[impl0, impl1], arbiter=with_arb, status="ok", error=None,
               loadavg_before=os.getloadavg()[0])
    link = ShapedLink(args.rate)
    veth = arb = None
    try:
        link.create()
        rec["qdisc"] = link.qdisc().strip()
        jobs = []
        for i, impl in enumerate((impl0, impl1)):
            env = dict(args.prio_env) if impl == "prio" else {}
            jobs.append(JobSpec(name=f"job{i}", impl=impl, model=args.model, batch=args.batch,
                                steps=args.steps, warmup=args.warmup, threads=args.threads,
                                cpus=cpus_for(i, args.pin), env=env))
        if with_arb:
            veth = VethToHost(link, args.host_addr, args.ns_addr).create()
            arb = ArbiterProcess(str(args.host_addr.ip), secret_file, args.arbiter_credit,
                          args.starvation_bound, workdir / "arbiter.log", args.arbiter_cpus,
                          order=with_arb)
            rec["arbiter_address"] = arb.start()
            for j in jobs:
                j.env.update({"HOROVOD_PRIO_ARBITER": arb.address,
                              "HOROVOD_PRIO_LINK": LINK_NAME,
                              "HOROVOD_PRIO_ARBITER_SECRET": secret,
                              "HOROVOD_PRIO_JOB_ID": j.name})
                if args.arbiter_timeout is not None:
                    j.env["HOROVOD_PRIO_ARBITER_TIMEOUT"] = str(args.arbiter_timeout)
        rec.update(run_jobs(link, jobs, workdir, args.job_timeout, progress,
                            stall_timeout=args.stall_timeout))
        if arb is not None:
            rec["arbiter_stats"] = arb.stats()
        for j in rec["jobs"]:      # never store the secret
            env = (j.get("meta") or {}).get("env") or {}
            if "HOROVOD_PRIO_ARBITER_SECRET" in env:
                env["HOROVOD_PRIO_ARBITER_SECRET"] = "<hidden>"
        add_trace_fields(rec, workdir)
    except RunFailed as e:
        rec["status"], rec["error"] = "failed", str(e)
    finally:
        rec["loadavg_after"] = os.getloadavg()[0]
        try:
            link.kill_processes()
        finally:
            if arb is not None:
                arb.stop()
            if veth is not None:
                veth.cleanup()
            link.cleanup()
    return rec


# ---------------------------------------------------------------- summary
def summarize(results: dict) -> list[dict]:
    runs = results.get("runs", [])
    stats = {}
    for r in runs:
        if r.get("status") == "ok":
            stats[(r["config_name"], r["repeat"])] = report.run_stats(r)
    order = results.get("meta", {}).get("configs") or list(CONFIGS)
    rows = []
    for c in order:
        rs = [r for r in runs if r.get("config_name") == c]
        ok = [r for r in rs if (c, r["repeat"]) in stats]
        row = {"config": c, "label": LABELS[c], "runs": len(rs), "runs_ok": len(ok)}
        if ok:
            st = [stats[(c, r["repeat"])] for r in ok]
            row["job_s"] = [report.median([s["jobs"][i]["median"] for s in st]) for i in range(2)]
            row["mean_s"] = report.median([s["mean_of_jobs"] for s in st])
            row["floor_s"] = report.median([s.get("floor") for s in st])
            row["link_busy"] = report.median([s.get("link_busy") for s in st])
            sp, worst = [], []
            for r in ok:
                b = stats.get(("hvd", r["repeat"]))
                s = stats[(c, r["repeat"])]
                if not b or not b["mean_of_jobs"] or not s["mean_of_jobs"]:
                    continue
                sp.append(b["mean_of_jobs"] / s["mean_of_jobs"])
                worst.append(max(s["jobs"][i]["median"] / b["jobs"][i]["median"] - 1
                                 for i in range(2)))
            row["speedup"] = report.median(sp)
            row["worst_job_change"] = report.median(worst)
            waits = [w for r in ok for w in (r.get("arbiter_waits") or {}).values() if w]
            if waits and any(w["chunks"] for w in waits):
                # waiting time per job per measured step, median over jobs x repeats
                per_step = []
                for r in ok:
                    s = stats[(c, r["repeat"])]
                    for i, j in enumerate(s["jobs"]):
                        w = (r.get("arbiter_waits") or {}).get(j["name"])
                        if w and j["n"]:
                            per_step.append(w.get("wait_union_s", w["wait_total_s"]) / j["n"])
                row["wait_per_step_s"] = report.median(per_step)
                row["wait_median_ms"] = report.median([w["wait_median_ms"] for w in waits])
            row["chunks_inflight"] = report.median([r.get("chunks_inflight") for r in ok])
            bd = [b for r in ok for b in (r.get("breakdown") or {}).values() if b]
            if bd:
                row["compute_s"] = report.median([b["compute_s"] for b in bd])
                row["comm_s"] = report.median([b["comm_s"] for b in bd])
            ast = [r.get("arbiter_stats") for r in ok if r.get("arbiter_stats")]
            if ast:
                ls = [a["links"].get(LINK_NAME, {}) for a in ast]
                row["arb_grants"] = report.median([x.get("grants") for x in ls])
                row["arb_waits"] = report.median([x.get("waits") for x in ls])
                row["arb_expired"] = sum(x.get("expired_leases", 0) for x in ls)
        rows.append(row)
    return rows


def markdown(results: dict) -> str:
    meta = results.get("meta", {})
    f = report.fmt
    lines = [
        f"Command: `{meta.get('command')}` — {meta.get('date')}, git {meta.get('git')}, "
        f"{meta.get('ncpu')} cores, pin={meta.get('pin')}, {meta.get('model')} batch "
        f"{meta.get('batch')}/rank, link {meta.get('rate')}, {meta.get('steps')} measured steps "
        f"after {meta.get('warmup')} warmup, repeats={meta.get('repeats')}, arbiter credit "
        f"{meta.get('arbiter_credit')}, prio env {meta.get('prio_env') or '{}'}",
        "",
        f"| jobs | job0 s/step | job1 s/step | mean s/step | {report.floor_column(netns.MTU)} "
        "| speedup vs hvd+hvd "
        "| worst job vs hvd | link busy | any chunk in flight | arbiter wait / step "
        "| arbiter grants queued | prio compute / comm per step | runs ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summarize(results):
        if not r["runs_ok"]:
            lines.append(f"| {r['label']} | | | | | | | | | | | | 0/{r['runs']} |")
            continue
        w = r.get("wait_per_step_s")
        cc = ("–" if r.get("compute_s") is None
              else f"{r['compute_s']:.3f} / {r['comm_s']:.3f} s")
        q = "–" if r.get("arb_grants") is None else f"{r['arb_waits']:.0f}/{r['arb_grants']:.0f}"
        lines.append(
            f"| {r['label']} | {f(r['job_s'][0])} | {f(r['job_s'][1])} | {f(r['mean_s'])} "
            f"| {f(r['floor_s'])} | {f(r['speedup'], '{:.2f}×')} "
            f"| {f(r['worst_job_change'], '{:+.1%}')} | {f(r['link_busy'], '{:.0%}')} "
            f"| {f(r.get('chunks_inflight'), '{:.0%}')} "
            f"| {'–' if w is None else f'{w * 1e3:.0f} ms'} "
            f"| {q} | {cc} "
            f"| {r['runs_ok']}/{r['runs']} |")
    fails = [r for r in results.get("runs", []) if r.get("status") != "ok"]
    for r in fails:
        lines += ["", f"Failed ({r.get('label')}): {(r.get('error') or '').splitlines()[0][:200]}"]
    lines += report.notes_and_load(results, meta)
    lines += ["", "s/step: median over repeats of each job's median step time over the overlap "
              "window (warmup excluded). speedup: hvd+hvd mean s/step ÷ this config's, same "
              "repeat, median over repeats. worst job: largest per-job slowdown vs the hvd+hvd "
              "run's same job, same repeat, median over repeats. link busy: tc bytes sent on the "
              "shaped lo ÷ (rate × time) over the overlap window. arbiter wait / step: time in which "
              "at least one of a job's chunks was between request and grant (union of the "
              "HOROVOD_PRIO_TRACE 'arbiter' spans, incl. the grant round trip) per measured "
              "step, median over jobs and repeats. "
              "any chunk in flight: share of the window in which at least one prio job had a "
              "released chunk not yet reduced (rank-0 traces). arbiter grants queued: grants "
              "not given on arrival / all grants, whole run incl. warmup, median over repeats. "
              "prio compute / comm: from the prio jobs' rank-0 traces, step start -> first "
              "gradient chunk ready, and first chunk ready -> last chunk reduced (medians over "
              "steps, jobs, repeats); a job's comm does not overlap its own compute, so "
              "compute + comm alone (2·S·8/rate) bounds its step time from below."]
    return "\n".join(lines)


def write_report(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    results_io.save(out, results)
    (out / "results.md").write_text(markdown(results) + "\n")
    # step-time plot: reuse report.plot on repeat 0 of every config
    # (report.plot knows scenarios a/b/c only: show these as "b", the arbiter in the title)
    runs = [dict(r, scenario="b", config=r["config"][:1] + [r["config"][1] + (
                 " + arbiter" if r.get("arbiter") else "")])
            for r in results["runs"] if r.get("status") == "ok" and r.get("repeat") == 0]
    if runs:
        try:
            report.plot({"meta": results["meta"], "runs": runs}, out / "steps.png")
        except Exception as e:   # plotting is a convenience, never fail the benchmark
            sys.stderr.write(f"[arbiter-bench] plot failed: {e}\n")


def plot_timeline(runs: list[tuple[str, Path, tuple[float, float] | None]], path: Path,
                  seconds: float = 2.0) -> Path | None:
    """Gantt chart from rank-0 traces: per prio job, its steps (compute = step start ->
    first chunk ready), each chunk's wait for a grant (local credit or arbiter) and its
    allreduce; ``seconds`` from the middle of each run's overlap window."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = []
    for title, raw, win in runs:
        jobs = sorted(raw.glob("job*.trace.json"))
        if not jobs or not win:
            continue
        t0 = (win[0] + win[1]) / 2 - seconds / 2
        panels.append((title, jobs, (t0, t0 + seconds)))
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 1.9 * len(panels) + 0.5), dpi=70,
                             squeeze=False)
    for ax, (title, jobs, (a, b)) in zip(axes[:, 0], panels):
        for k, tp in enumerate(jobs):
            evs = trace_events(tp)
            y = 2 * (len(jobs) - 1 - k)
            steps = [(s0, s1) for s0, s1 in spans(evs, "step", None) if s1 > a and s0 < b]
            ready = sorted(float(e["ts"]) / 1e6 for e in evs if e.get("cat") == "chunk"
                           and (e.get("args") or {}).get("kind") == "ready")
            for s0, s1 in steps:
                r = [t for t in ready if s0 <= t <= s1]
                c1 = r[0] if r else s1
                ax.broken_barh([(s0 - a, c1 - s0)], (y + 1.05, 0.8), color="0.75")
                ax.axvline(s0 - a, ymin=0, ymax=1, color="0.85", lw=0.5)
            for tid, col, yy in (("wait", "tab:red", y + 0.55), ("allreduce", "tab:blue", y)):
                sp = [(t0, t1) for t0, t1 in spans(evs, "chunk", None, tid) if t1 > a and t0 < b]
                ax.broken_barh([(t0 - a, t1 - t0) for t0, t1 in sp], (yy, 0.45), color=col,
                               alpha=0.6)
            ax.text(-0.01 * seconds, y + 1, tp.name.split(".")[0], ha="right", va="center",
                    fontsize=7)
        ax.set_xlim(0, seconds)
        ax.set_yticks([])
        ax.set_title(title, fontsize=8, loc="left")
        ax.tick_params(labelsize=7)
    axes[-1, 0].set_xlabel("seconds (grey: compute until the first gradient chunk is ready; "
                           "red: chunk waiting for its grant; blue: chunk allreduce)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def report_only(out: Path) -> int:
    results = results_io.load(out)
    for rec in results["runs"]:
        raw = out / "raw" / str(rec.get("label"))
        if rec.get("status") == "ok" and raw.is_dir():
            add_trace_fields(rec, raw)
    write_report(results, out)
    tl = [(f"{LABELS[r['config_name']]} (repeat {r['repeat'] + 1})", out / "raw" / r["label"],
           report.overlap_window(r)) for r in results["runs"]
          if r.get("status") == "ok" and r.get("config_name") in ("prio", "arb", "burst")
          and (out / "raw" / str(r.get("label"))).is_dir()]
    if tl:
        last = max(r["repeat"] for r in results["runs"])   # latest repeat: least start-up noise
        pick = [x for x in tl if x[0].endswith(f"(repeat {last + 1})")] or tl[:2]
        plot_timeline(pick, out / "timeline.png")
    sys.stdout.write(markdown(results) + "\n")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report_only:
        return report_only(Path(args.out))
    if not preflight("arbiter-bench"):
        return 2
    netns.cleanup_stale()
    out = Path(args.out)
    workroot = Path(tempfile.mkdtemp(prefix="hprio-arbbench-"))
    secret = secrets.token_urlsafe(32)
    secret_file = workroot / "secret"
    secret_file.write_text(secret)
    os.chmod(secret_file, 0o600)
    runs = plan(args.configs, args.repeats)
    progress = Progress(len(runs))
    results = {"meta": {
        "command": "python -m benchmarks.arbiter_bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git": git_rev(), "ncpu": os.cpu_count(), "pin": args.pin, "threads": args.threads,
        "model": args.model, "batch": args.batch, "rate": args.rate, "steps": args.steps,
        "warmup": args.warmup, "repeats": args.repeats, "configs": args.configs,
        "prio_env": dict(args.prio_env), "arbiter_credit": args.arbiter_credit,
        "starvation_bound": args.starvation_bound, "arbiter_timeout": args.arbiter_timeout,
        "arbiter_cpus": args.arbiter_cpus, "host_addr": str(args.host_addr), "ns_addr": str(args.ns_addr), "link": LINK_NAME,
    }, "runs": []}
    stopped, failed = run_all(
        runs, results, out, workroot, progress, keep_raw=args.keep_raw, tag="arbiter-bench",
        write=write_report, raw_ignore=shutil.ignore_patterns("secret"),
        describe=lambda r: f"{LABELS[r['config_name']]} (repeat {r['repeat'] + 1}/{args.repeats})",
        execute=lambda r: execute_run(r, args, workroot, secret_file, secret, progress))
    if stopped is not None:
        return stopped
    sys.stdout.write(markdown(results) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
