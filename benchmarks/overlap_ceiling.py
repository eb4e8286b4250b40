"""What barrier crossing (``hvd.overlap``) can gain on a model, per chunk setting.

    python -m benchmarks.overlap_ceiling --profile PROFILE.json --rate 300mbit \\
        --hvd-step 0.706 --out results/sim/overlap-ceiling-mnv2-300mbit

Runs the simulator (``horovod_prio.sim``: the product's chunk plan, release
scheduler and the overlap rule of docs/sim.md) for one job of ``--workers``
ranks on one link: plain Horovod, and horovod_prio with ``hvd.overlap`` at
every ``--partitions`` x ``--credits`` setting. The profile is measured one
process alone (``benchmarks.profile_model``); on the testbed the ranks share
cores with their communication threads, so its compute is scaled: by
``--compute-scale``, or fitted so that the simulated plain-Horovod step equals
``--hvd-step`` (a measured median, same model, batch and rate). Reported:
the simulated plain-Horovod step, the bound no schedule can beat
(``max(compute, link floor)``, the link floor in wire bytes at ``--mtu``), the tighter bound no per-layer barrier
crossing can beat (:func:`per_layer_bound`) and each setting's ratio plain
Horovod / overlap (> 1: faster). Not modelled: CPU shared with communication and with
the background update, Horovod's negotiation beyond its cycle time.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from typing import List, Optional

from horovod_prio.method import units
from horovod_prio.method.config import PriorityConfig
from horovod_prio.sim.engine import TOPOLOGIES, JobSpec, LinkConfig, comm_floor, simulate
from horovod_prio.sim.profiles import BUILTIN, Profile, get_profile

from horovod_prio.sim.wire import check_mtu

from .bounds import floor_label, overlap_bound
from .bounds import per_layer_bound as per_layer_bound_of
from .harness import git_rev
from .netns import MTU as LO_MTU
from .testbed import MTU as TESTBED_MTU


def default_mtu(topology: str) -> int:
    """The MTU of the link a topology stands for: ``bus``, the harness's shaped
    ``lo``; ``nic``, the testbed's uplink."""
    return LO_MTU if topology == "bus" else TESTBED_MTU


def _steady(result) -> float:
    """Median step time without the first step (nothing to wait for yet) and
    the last (the final flush)."""
    xs = result.step_times(0)
    return statistics.median(xs[1:-1] if len(xs) > 3 else xs)


def plain_step(profile: Profile, workers: int, link: LinkConfig, steps: int) -> float:
    return _steady(simulate([JobSpec(profile, workers, steps)], "fifo", link))


def overlap_step(profile: Profile, workers: int, link: LinkConfig, steps: int,
                 partition: int, credit: Optional[int]) -> float:
    pc = PriorityConfig.from_env({}, partition_bytes=partition, credit_bytes=credit)
    return _steady(simulate([JobSpec(profile, workers, steps, overlap=True)], "priority",
                            link, pc))


def fit_scale(profile: Profile, workers: int, link: LinkConfig, steps: int,
              target: float) -> float:
    """The compute scale at which the simulated plain-Horovod step is ``target``
    seconds (bisection; the step grows with the scale)."""
    lo, hi = 1e-3, 1.0
    while plain_step(profile.scaled(hi), workers, link, steps) < target:
        hi *= 2
        if hi > 1e4:
            raise ValueError(f"--hvd-step {target:g} s is not reachable by scaling the "
                             f"profile's compute (link floor alone exceeds it?)")
    if plain_step(profile.scaled(lo), workers, link, steps) > target:
        raise ValueError(f"--hvd-step {target:g} s is below what the link alone needs "
                         f"({plain_step(profile.scaled(lo), workers, link, steps):.4f} s)")
    for _ in range(40):
        mid = (lo + hi) / 2
        if plain_step(profile.scaled(mid), workers, link, steps) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def per_layer_bound(profile: Profile, workers: int, link: LinkConfig) -> float:
    """A lower bound on the step time of *any* schedule that lets the next
    step's forward start on layers already reduced (per-layer barrier
    crossing, in any implementation), on a link carrying one job:

    for every layer i, the gradients of layer i and of every layer before it
    (input side: they become ready after layer i's, in backprop) must cross
    the link between layer i's gradient becoming ready and the next step's
    forward reaching layer i; in between run the forward from layer i to the
    end and the backward back to layer i. So the period is at least
    ``sum(c_j, j <= i) + forward(i..) + backward(..i)`` for every i, with
    c_j the link time of layer j's gradient alone."""
    floor = comm_floor(profile, workers, link)
    per_byte = floor / profile.grad_bytes if profile.grad_bytes else 0.0
    layers = profile.layers
    return per_layer_bound_of([l.forward_s for l in layers], [l.backward_s for l in layers],
                              [l.params * profile.dtype_bytes * per_byte for l in layers])


def ceiling(profile: Profile, workers: int, link: LinkConfig, steps: int,
            partitions: List[int], credits: List[Optional[int]]) -> dict:
    hvd = plain_step(profile, workers, link, steps)
    floor = comm_floor(profile, workers, link)
    grid = [{"partition_bytes": p, "credit_bytes": c,
             "step_s": overlap_step(profile, workers, link, steps, p, c)}
            for p in partitions for c in credits]
    for g in grid:
        g["speedup"] = hvd / g["step_s"]
    best = min(grid, key=lambda g: g["step_s"])
    layer_bound = per_layer_bound(profile, workers, link)
    return {"compute_s": profile.compute_s, "forward_s": profile.forward_s,
            "grad_bytes": profile.grad_bytes, "link_floor_s": floor, "hvd_step_s": hvd,
            "bound_speedup": hvd / overlap_bound(profile.forward_s, profile.backward_s, floor),
            "per_layer_bound_s": layer_bound,
            "per_layer_bound_speedup": hvd / max(profile.compute_s, floor, layer_bound),
            "grid": grid, "best": best}


def _fmt_bytes(b: Optional[int]) -> str:
    if b is None:
        return "none"
    return f"{b / (1 << 20):g} MiB" if b >= 1 << 20 else f"{b / 1024:g} KiB"


def table(res: dict, partitions, credits) -> str:
    by = {(g["partition_bytes"], g["credit_bytes"]): g["speedup"] for g in res["grid"]}
    best = res["best"]
    lines = [f"compute {res['compute_s']:.3f} s/step (forward {res['forward_s']:.3f}), "
             f"gradients {res['grad_bytes'] / (1 << 20):.2f} MiB, link floor "
             f"{res['link_floor_s']:.3f} s; simulated plain Horovod {res['hvd_step_s']:.3f} "
             f"s/step; no schedule beats max(compute, floor): at most "
             f"{res['bound_speedup']:.2f}x; no per-layer barrier crossing beats "
             f"{res['per_layer_bound_s']:.3f} s/step (a layer's own and all input-side "
             f"gradients cross the link between its gradient and its next forward): at "
             f"most {res['per_layer_bound_speedup']:.2f}x.", "",
             "plain Horovod / hvd.overlap (rows: partition_bytes, columns: credit_bytes):", "",
             "| partition \\ credit | " + " | ".join(_fmt_bytes(c) for c in credits) + " |",
             "|---|" + "---|" * len(credits)]
    for p in partitions:
        cells = []
        for c in credits:
            v = by[(p, c)]
            mark = "**" if (p, c) == (best["partition_bytes"], best["credit_bytes"]) else ""
            cells.append(f"{mark}{v:.2f}x{mark}")
        lines.append(f"| {_fmt_bytes(p)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _credit(text: str) -> Optional[int]:
    t = text.strip().lower()
    if t in ("none", "unlimited", "0"):
        return None
    return units.parse_bytes(text, 1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overlap_ceiling",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", required=True,
                   help="profile JSON (benchmarks.profile_model) or a built-in model: "
                        + ", ".join(BUILTIN))
    p.add_argument("--rate", required=True, type=units.arg(units.parse_rate_bytes_per_s),
                   help="link rate, e.g. 300mbit")
    p.add_argument("--workers", type=units.arg(units.parse_int, 2), default=2)
    p.add_argument("--topology", choices=TOPOLOGIES, default="bus",
                   help="bus: every rank crosses the link (the harness's shaped lo; default)")
    p.add_argument("--mtu", type=units.arg(units.parse_int, 0), default=None,
                   help="frames of this MTU carry the link's bytes, their headers counted "
                        "(horovod_prio.sim.wire; 0: payload only); default: the MTU of the "
                        f"link --topology stands for: the harness's shaped lo ({LO_MTU}) for "
                        f"bus, the testbed's uplink ({TESTBED_MTU}) for nic")
    p.add_argument("--steps", type=units.arg(units.parse_int, 4), default=30)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--hvd-step", type=float, default=None,
                   help="measured plain-Horovod s/step: fit the compute scale to it")
    g.add_argument("--compute-scale", type=float, default=1.0)
    p.add_argument("--partitions", default="512KiB,1MiB,2MiB,4MiB")
    p.add_argument("--credits", default="none,512KiB,1MiB,2MiB,4MiB,8MiB",
                   help="comma list; none = unlimited (the default credit)")
    p.add_argument("--out", default=None, help="directory for ceiling.md / ceiling.json")
    a = p.parse_args(argv)
    try:
        parts = [units.parse_bytes(x, 1) for x in a.partitions.split(",") if x.strip()]
    except ValueError as e:
        p.error(f"argument --partitions: {e}")
    try:
        credits = [_credit(x) for x in a.credits.split(",") if x.strip()]
    except ValueError as e:
        p.error(f"argument --credits: {e}")
    if not parts or not credits:
        p.error("argument --partitions/--credits: empty list")
    if a.hvd_step is not None and not a.hvd_step > 0:
        p.error(f"argument --hvd-step: must be > 0, got {a.hvd_step}")
    if not a.compute_scale > 0:
        p.error(f"argument --compute-scale: must be > 0, got {a.compute_scale}")
    try:
        prof = get_profile(a.profile)
    except (OSError, ValueError) as e:
        p.error(f"argument --profile: {e}")
    mtu = a.mtu if a.mtu is not None else default_mtu(a.topology)
    try:
        check_mtu(mtu)
    except ValueError as e:
        p.error(f"argument --mtu: {e}")
    link = LinkConfig(bandwidth=a.rate, topology=a.topology, mtu=mtu)
    try:
        scale = (fit_scale(prof, a.workers, link, a.steps, a.hvd_step)
                 if a.hvd_step is not None else a.compute_scale)
    except ValueError as e:
        p.error(str(e))
    res = ceiling(prof.scaled(scale), a.workers, link, a.steps, parts, credits)
    res.update(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               git=git_rev(), profile=a.profile, rate_bit_s=a.rate * 8, workers=a.workers,
               topology=a.topology, mtu=mtu,
               compute_scale=scale, hvd_step_measured=a.hvd_step,
               command="python -m benchmarks.overlap_ceiling " + " ".join(
                   sys.argv[1:] if argv is None else argv))
    head = (f"{prof.name}, batch {prof.batch_size}, {a.workers} ranks, {a.rate * 8 / 1e6:g} Mbit/s "
            f"{a.topology}, link floor in {floor_label(mtu)}, compute scale {scale:.3f}"
            + (f" (fitted: simulated plain Horovod = measured {a.hvd_step:g} s/step)"
               if a.hvd_step is not None else ""))
    text = head + "\n\n" + table(res, parts, credits)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "ceiling.json"), "w") as f:
            json.dump(res, f, indent=1)
        with open(os.path.join(a.out, "ceiling.md"), "w") as f:
            f.write(f"# Overlap ceiling (simulated)\n\nCommand: `{res['command']}`\n\n{text}\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
