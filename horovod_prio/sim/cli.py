"""``horovod-prio sim``: simulate K jobs x N workers sharing one link.

Examples::

    horovod-prio sim --model resnet50 --jobs 2 --workers 8 --bandwidth 10gbit \\
        --steps 200 --mode all --out results/sim/resnet50
    horovod-prio sim --model vgg16,resnet50 --jobs 8 --workers 1000 --bandwidth 100gbit
    horovod-prio sim --validate --out results/sim/validation
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import time
from dataclasses import replace
from typing import List, Optional

from ..arbiter.core import Arbiter
from ..method import units
from ..method.config import PriorityConfig
from .engine import GRAD_ORDERS, MODES, TOPOLOGIES, JobSpec, LinkConfig, simulate
from .profiles import BUILTIN, DEFAULT_TFLOPS, get_profile
from .report import markdown_table, summarize, write_outputs

_rate = units.arg(units.parse_rate_bytes_per_s)          # the engine computes in bytes/s
_duration = units.arg(units.parse_duration_s)


def _int_list(text):
    out = []
    for part in str(text).split(","):
        try:
            v = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= 1 or a comma-separated list of them, got {text!r}")
        if v < 1:
            raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
        out.append(v)
    return out


def _float_range(lo: float, hi: Optional[float] = None, lo_open=False, hi_open=True):
    def parse(text):
        try:
            v = float(text)
        except ValueError:
            v = float("nan")
        ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and (
            hi is None or (v < hi if hi_open else v <= hi))
        if not ok:
            rng = f"{'>' if lo_open else '>='} {lo:g}" + (
                f" and {'<' if hi_open else '<='} {hi:g}" if hi is not None else "")
            raise argparse.ArgumentTypeError(f"expected a number {rng}, got {text!r}")
        return v
    return parse


_bytes = units.arg(units.parse_bytes, 1)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="horovod-prio sim", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Discrete-event simulation of K data-parallel jobs x N workers on one "
                    "shared link: Horovod FIFO vs priority release vs cross-job arbiter vs "
                    "arbiter + adaptive policy (JP7042897B2).", epilog=__doc__)
    a = p.add_argument
    a("--model", default="resnet50",
      help=f"{' | '.join(BUILTIN)} | PROFILE.json; a comma list assigns models to jobs "
           f"round-robin (default resnet50)")
    a("--jobs", type=units.arg(units.parse_int, 1), default=2,
      help="jobs sharing the link (default 2)")
    a("--workers", type=units.arg(units.parse_int, 1), default=8,
      help="workers (ranks) per job (default 8)")
    a("--bandwidth", type=_rate, default=_rate("10gbit"),
      help="link rate in bits/s: 10gbit, 25gbit, 100mbit, 1e9 (default 10gbit)")
    a("--latency", type=_duration, default=5e-6,
      help="per ring-hop latency, e.g. 5us (default); a message costs 2(N-1) of them")
    a("--mtu", type=units.arg(units.parse_int, 0), default=0,
      help="the link carries TCP over Ethernet frames of this MTU, their headers "
           "included (1500: 1514 bytes per 1448 of payload); 0: payload only (default)")
    a("--topology", choices=TOPOLOGIES, default="nic",
      help="nic: one link per worker (cluster); bus: all ranks cross one link "
           "(shaped loopback) (default nic)")
    a("--steps", type=_int_list, default=[100],
      help="steps per job, or a comma list per job (default 100)")
    a("--stagger", type=_float_range(0), default=0.0,
      help="job k starts at k*STAGGER seconds (default 0)")
    a("--jitter", type=_float_range(0, 1), default=0.02,
      help="per-step compute time noise, x U(1-j, 1+j) (default 0.02)")
    a("--seed", type=int, default=0)
    a("--grad-order", choices=GRAD_ORDERS, default=None,
      help="the order the backward pass produces the gradients in: backprop (layer by layer "
           "from the output side) or inline (TensorFlow with one inter-op thread: the input "
           "side's first; docs/sim.md) (default backprop; inline with --validate, whose harness "
           "runs TensorFlow on one thread)")
    a("--mode", choices=list(MODES) + ["all"], default="all")
    a("--tflops", type=_float_range(0, lo_open=True), default=DEFAULT_TFLOPS,
      help=f"effective compute throughput for built-in models (default {DEFAULT_TFLOPS:g})")
    a("--compute-scale", type=_float_range(0, lo_open=True), default=1.0,
      help="multiply every compute time (e.g. to set the compute/comm ratio)")
    a("--cycle-time", type=_duration, default=1e-3, help="Horovod cycle time (default 1ms)")
    a("--fusion-threshold", type=_bytes, default=128 * 1024 * 1024,
      help="Horovod fusion buffer (default 128MiB)")
    a("--arbiter-order", choices=Arbiter.ORDERS, default="burst",
      help="the product arbiter's cross-job order (its --order; default burst)")
    a("--arbiter-credit", type=_bytes, default=8 * 1024 * 1024,
      help="granted-but-unfinished bytes per link (default 8MiB, the arbiter's default)")
    a("--arbiter-class-reserve", type=units.arg(units.parse_class_reserve), default=0.0,
      help="share of the link credit kept free for the highest connected job class "
           "(the arbiter's --class-reserve; default 0 = off, its default)")
    a("--starvation-bound", type=units.arg(units.parse_int, 0), default=8,
      help="arbiter starvation bound K, 0 = none (default 8, the arbiter's default)")
    a("--overlap", action="store_true",
      help="barrier crossing (hvd.overlap) in the priority modes: the next step's forward "
           "starts on layers already reduced; fifo stays plain Horovod")
    a("--step-overhead", type=_duration, default=0.0,
      help="fixed time added to every step (optimizer apply, input pipeline)")
    a("--collective-overhead", type=_duration, default=0.0,
      help="time every collective costs before it occupies the link (Horovod's negotiation, "
           "per-op work; benchmarks.sim_check --calibrate measures it on the testbed)")
    a("--arbiter-rtt", type=_duration, default=0.0,
      help="job <-> arbiter round trip added to every grant (arbiter modes)")
    g = p.add_argument_group("priority / policy knobs (PriorityConfig fields; defaults from it)")
    for flag, field_ in (("--num-groups", "num_groups"), ("--count-threshold", "count_threshold"),
                         ("--adjust-groups", "adjust_groups"), ("--boost-step", "step"),
                         ("--max-boost", "max_boost"), ("--warmup-batches", "warmup_batches"),
                         ("--partition-bytes", "partition_bytes"),
                         ("--credit-bytes", "credit_bytes"), ("--coefficient", "coefficient"),
                         ("--relative-coefficient", "relative_coefficient"),
                         ("--scene", "scene"), ("--ratio-threshold", "ratio_threshold")):
        g.add_argument(flag, dest="pc_" + field_, default=None, metavar="V",
                       help=f"PriorityConfig.{field_}")
    a("--validate", action="store_true",
      help="simulate the emulated-link harness configs and compare with measurements")
    a("--profile", default=None, help="--validate: measured MLP profile JSON")
    a("--ranks-per-core", type=_float_range(0, lo_open=True), default=2.0,
      help="--validate: compute slow-down from ranks sharing a core (default 2)")
    a("--out", default=None, help="directory for results.json/.md, steps.csv, steps.png")
    a("--no-plot", action="store_true")
    a("--no-alone", action="store_true", help="skip the per-job alone baselines")
    return p


_FLAG_OF = {"step": "--boost-step"}


def _priority_config(args) -> PriorityConfig:
    kwargs = {k[3:]: v for k, v in vars(args).items() if k.startswith("pc_") and v is not None}
    try:
        return PriorityConfig.from_env({}, **kwargs)
    except ValueError as e:
        msg = str(e)
        for name in kwargs:
            flag = _FLAG_OF.get(name, "--" + name.replace("_", "-"))
            if name in msg:
                raise ValueError(f"argument {flag}: {msg}") from None
        raise


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed the message naming the flag
        return int(e.code or 0)
    try:
        return _run(args, argv)
    except ValueError as e:
        print(f"horovod-prio sim: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `| head`: stop quietly
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0


def _run(args, argv) -> int:
    pcfg = _priority_config(args)
    command = "horovod-prio sim " + " ".join(shlex.quote(a) for a in argv)
    if args.validate:
        from .validate import validate, validation_table
        v = validate(args.profile, ranks_per_core=args.ranks_per_core, priority=pcfg,
                     grad_order=args.grad_order or "inline")
        table = validation_table(v)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "validation.json"), "w") as f:
                json.dump(dict(v, command=command), f, indent=1)
            with open(os.path.join(args.out, "validation.md"), "w") as f:
                f.write("# Simulator vs emulated link\n\nCommand: `" + command + "`\n\n"
                        + table + "\n")
            print(f"wrote {args.out}/validation.json, validation.md", file=sys.stderr)
        print(table)
        return 0
    names = [m.strip() for m in args.model.split(",") if m.strip()]
    if not names:
        raise ValueError("argument --model: empty")
    profiles = {}
    for n in names:
        try:
            profiles[n] = get_profile(n, tflops=args.tflops).scaled(args.compute_scale)
        except ValueError as e:
            raise ValueError(f"argument --model: {e}") from None
    if len(args.steps) not in (1, args.jobs):
        raise ValueError(f"argument --steps: give one value or one per job ({args.jobs}), "
                         f"got {len(args.steps)}")
    link = LinkConfig(bandwidth=args.bandwidth, latency=args.latency, topology=args.topology,
                      mtu=args.mtu,
                      cycle_time=args.cycle_time, fusion_threshold=args.fusion_threshold,
                      starvation_bound=args.starvation_bound, step_overhead=args.step_overhead,
                      collective_overhead=args.collective_overhead,
                      arbiter_rtt=args.arbiter_rtt, arbiter_credit=args.arbiter_credit,
                      arbiter_order=args.arbiter_order,
                      arbiter_class_reserve=args.arbiter_class_reserve)
    try:
        link.validate()
    except ValueError as e:
        raise ValueError(f"argument --{str(e).split()[0].replace('_', '-')}: {e}") from None
    grad_order = args.grad_order or "backprop"
    jobs = [JobSpec(profiles[names[k % len(names)]], args.workers,
                    args.steps[k % len(args.steps)], start=k * args.stagger,
                    name=f"job{k}", jitter=args.jitter, seed=args.seed,
                    grad_order=grad_order)
            for k in range(args.jobs)]
    modes = list(MODES) if args.mode == "all" else [args.mode]
    t0 = time.perf_counter()
    alone = {}
    if not args.no_alone:
        cache = {}
        for k, j in enumerate(jobs):
            key = (j.profile.name, j.steps)
            if key not in cache:
                solo = replace(j, start=0.0)
                r = simulate([solo], "fifo", link, pcfg)
                xs = r.step_times(0)[1:] or r.step_times(0)
                cache[key] = statistics.fmean(xs)
            alone[k] = cache[key]
    results, rows = {}, []
    for m in modes:
        mj = jobs if m == "fifo" or not args.overlap else [replace(j, overlap=True) for j in jobs]
        r = simulate(mj, m, link, pcfg)
        results[m] = r
        rows += summarize(r, link, alone)
    elapsed = time.perf_counter() - t0
    title = (f"{args.jobs} job(s) x {args.workers} workers, {'/'.join(names)}, "
             f"{args.bandwidth * 8 / 1e9:g} Gbit/s {args.topology}")
    if args.out:  # files first, so a closed stdout pipe cannot lose them
        meta = {"command": command, "title": title, "wall_s": elapsed,
                "link": vars(link), "priority": pcfg.as_dict(redact_secrets=True),
                "models": {n: {"params": p.params, "compute_s": p.compute_s, "source": p.source}
                           for n, p in profiles.items()},
                "jitter": args.jitter, "seed": args.seed, "stagger": args.stagger,
                "grad_order": grad_order}
        paths = write_outputs(args.out, rows, results, meta, plot=not args.no_plot, title=title)
        print("wrote " + ", ".join(paths), file=sys.stderr)
    print(f"# {title}  (simulated in {elapsed:.2f} s)")
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
