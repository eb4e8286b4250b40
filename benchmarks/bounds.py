"""Bounds of the headline scenarios, and how much of a bound a result captures.

Pure arithmetic on measured parts (seconds, bytes, bits per second):

* **link floor** -- bytes that must cross the bottleneck / its rate, counted
  as the bottleneck's shaper counts them: whole frames on the wire, not
  payload. A TCP/IPv4 stream over Ethernet at MTU m carries m + 14 bytes per
  m - 52 of payload (1514 per 1448 at 1500: 4.6 % more), the simulator's
  frame rule (:mod:`horovod_prio.sim.wire`); ``mtu`` defaults to the
  testbed's (``benchmarks.testbed.MTU``), ``mtu=0`` counts payload only
  (:func:`link_floor`). A ring allreduce of S bytes on n ranks sends
  2(n-1)/n x S from every rank (reduce-scatter + allgather); when the ring
  crosses the bottleneck once per direction (the testbed's uplink), each
  direction carries that per job: :func:`ring_floor`.
* **overlap ceiling** -- the best step a barrier crossing (``hvd.overlap``:
  the next step's forward starts while gradients still cross the link) can
  reach: compute and communication overlap completely, so the step is at
  least ``max(forward + backward, comm)``; the ceiling's gain is the measured
  plain step over that (:func:`overlap_ceiling`).
* **per-layer bound** -- the overlap ceiling assumes the next forward can hide
  *all* the communication. It cannot: a layer's weights are needed by the next
  forward before the layers after it, and its gradient is ready after theirs.
  For every layer i (input side first), its own gradient and every input-side
  gradient (all ready after it in backprop, all needed before it in the next
  forward) must cross the link between layer i's gradient becoming ready and
  the next forward reaching layer i, while the forward from i to the output
  and the backward back to i run: the step is at least
  ``sum(link_j, j <= i) + sum(forward_j + backward_j, j >= i)`` for every i
  with a gradient (:func:`per_layer_bound`). A layer's weights are read whole,
  so no barrier crossing that keeps a tensor's gradient in one piece beats it.
  For a job whose ranks share one core, :func:`layer_bound` takes the job's
  compute per step and the link floor and splits them over the layers by a
  measured per-layer profile (its forward/backward times, its parameter
  counts).
* **class-1 bound** -- a class-1 job beside class-0 jobs can at best run as
  fast as alone: its alone time is its bound (:func:`class1`).
* **share of the bound captured** -- ``(t_base - t_ours) / (t_base - t_bound)``:
  1 = the whole headroom between the baseline and the bound, 0 = none of it,
  < 0 = slower than the baseline. Where the headroom ``(t_base - t_bound) /
  t_base`` is below 10 % the share is not reported ("no headroom"): a few
  percent of noise would swing it across its whole range (:func:`capture`).
* **A/A resolution** -- identical runs A and A' repeated in pairs: the
  relative difference ``(A' - A) / A`` of each pair; its median and maximum
  (in absolute value) are what a difference between two variants must exceed
  to mean something (:func:`aa_resolution`).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from horovod_prio.sim import wire
from horovod_prio.sim.wire import check_mtu

from .testbed import MTU

MIN_HEADROOM = 0.10


def _pos(name: str, value, zero_ok: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"{name} must be a finite number {'>=' if zero_ok else '>'} 0, "
                         f"got {value!r}")
    return float(value)


# ---------------------------------------------------------------- link floor
def ring_allreduce_bytes(grad_bytes: float, ranks: int) -> float:
    """Bytes each rank sends in a ring allreduce of ``grad_bytes``: 2(n-1)/n x S."""
    _pos("grad_bytes", grad_bytes, zero_ok=True)
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise ValueError(f"ranks must be an integer >= 1, got {ranks!r}")
    return 2 * (ranks - 1) / ranks * grad_bytes


def wire_bytes(nbytes: float, mtu: int = MTU) -> float:
    """Bytes a link of ``mtu`` carries for ``nbytes`` of TCP payload (0: payload only)."""
    return wire.wire_bytes(_pos("bytes", nbytes, zero_ok=True), check_mtu(mtu))


def link_floor(nbytes: float, rate_bps: float, mtu: int = MTU) -> float:
    """Seconds ``nbytes`` of TCP payload take through a bottleneck of
    ``rate_bps`` bits/s that counts Ethernet frames of ``mtu`` (0: payload only)."""
    nbytes = _pos("bytes", nbytes, zero_ok=True)
    rate = _pos("rate", rate_bps)
    return wire_bytes(nbytes, mtu) * 8 / rate


def ring_floor(grad_bytes: float, ranks: int, rate_bps: float, jobs: int = 1,
               mtu: int = MTU) -> float:
    """Link floor per step of ``jobs`` identical jobs whose ring allreduce of
    ``grad_bytes`` crosses a bottleneck of ``rate_bps`` once per direction, in
    frames of ``mtu``."""
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    return link_floor(jobs * ring_allreduce_bytes(grad_bytes, ranks), rate_bps, mtu)


def floor_label(mtu: int) -> str:
    """How a report names its link floor's unit: ``wire bytes at MTU 1500``."""
    return f"wire bytes at MTU {mtu}" if check_mtu(mtu) else "payload bytes (no framing)"


# ---------------------------------------------------------------- overlap ceiling
def overlap_bound(forward_s: float, backward_s: float, comm_s: float) -> float:
    """The shortest step any overlap of compute and communication allows."""
    return max(_pos("forward time", forward_s, True) + _pos("backward time", backward_s, True),
               _pos("communication time", comm_s, True))


@dataclass(frozen=True)
class Ceiling:
    bound_s: float      # max(forward + backward, comm)
    base_s: float       # the measured plain step
    speedup: float      # base / bound: the best ratio barrier crossing can show


def overlap_ceiling(forward_s: float, backward_s: float, comm_s: float,
                    base_s: float) -> Ceiling:
    """The overlap ceiling from a step's measured forward, backward and
    communication times and the measured plain-Horovod step ``base_s``."""
    bound = overlap_bound(forward_s, backward_s, comm_s)
    if bound <= 0:
        raise ValueError("forward + backward and communication time are all 0: no bound")
    base = _pos("base step", base_s)
    return Ceiling(bound, base, base / bound)


def _seq(name: str, values) -> list:
    try:
        vals = list(values)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of seconds, got {values!r}") from None
    return [_pos(f"{name}[{i}]", v, zero_ok=True) for i, v in enumerate(vals)]


def per_layer_bound(forward_s, backward_s, link_s) -> float:
    """The shortest step a per-layer barrier crossing allows: per layer, input
    side first, its forward and backward time and the link time of its
    gradient. ``max`` over layers i with ``link_s[i] > 0`` of
    ``sum(link_s[:i + 1]) + sum(forward_s[i:]) + sum(backward_s[i:])``
    (0 when no layer has a gradient)."""
    fwd, bwd, link = _seq("forward_s", forward_s), _seq("backward_s", backward_s), \
        _seq("link_s", link_s)
    if not (len(fwd) == len(bwd) == len(link)):
        raise ValueError(f"forward_s, backward_s and link_s must have one entry per layer, "
                         f"got {len(fwd)}, {len(bwd)} and {len(link)}")
    best, comm, tail = 0.0, 0.0, sum(fwd) + sum(bwd)
    for f, b, c in zip(fwd, bwd, link):
        comm += c
        if c > 0:
            best = max(best, comm + tail)
        tail -= f + b
    return best


def layer_bound(layers, compute_s: float, link_floor_s: float) -> float:
    """:func:`per_layer_bound` of a job from its measured totals: ``layers`` is
    a measured per-layer profile, input side first, as (parameters, forward
    s, backward s) per layer; its times are scaled so they add up to
    ``compute_s`` (the job's compute per step) and ``link_floor_s`` is split
    over the layers in proportion to their parameters."""
    rows = list(layers)
    if not rows:
        raise ValueError("layers: the profile has no layers")
    for i, r in enumerate(rows):
        if not isinstance(r, (tuple, list)) or len(r) != 3:
            raise ValueError(f"layers[{i}]: expected (parameters, forward s, backward s), "
                             f"got {r!r}")
    params = _seq("layers parameters", [r[0] for r in rows])
    fwd = _seq("layers forward s", [r[1] for r in rows])
    bwd = _seq("layers backward s", [r[2] for r in rows])
    compute, floor = _pos("compute time", compute_s, True), _pos("link floor", link_floor_s, True)
    total_p, total_t = sum(params), sum(fwd) + sum(bwd)
    if total_p <= 0:
        raise ValueError("layers: no layer has parameters: no per-layer bound")
    if total_t <= 0:
        raise ValueError("layers: the profile's forward and backward times are all 0")
    k = compute / total_t
    return per_layer_bound([f * k for f in fwd], [b * k for b in bwd],
                           [p / total_p * floor for p in params])


# ---------------------------------------------------------------- share captured
@dataclass(frozen=True)
class Capture:
    base_s: float
    ours_s: float
    bound_s: float
    ratio: float                 # base / ours (> 1: ours is faster)
    headroom: float              # (base - bound) / base
    share: float | None          # (base - ours) / (base - bound); None: no headroom
    note: str = ""

    def text(self) -> str:
        if self.share is None:
            return f"{self.ratio:.2f}x, {self.note}"
        return f"{self.ratio:.2f}x, {self.share:.0%} of the bound's gain" + (
            f" ({self.note})" if self.note else "")


def capture(base_s: float, ours_s: float, bound_s: float,
            min_headroom: float = MIN_HEADROOM) -> Capture:
    """How much of the headroom from the baseline ``base_s`` to the bound
    ``bound_s`` (both step times, lower is better) ``ours_s`` captured."""
    base, ours, bound = _pos("base", base_s), _pos("ours", ours_s), _pos("bound", bound_s)
    headroom = (base - bound) / base
    ratio = base / ours
    if headroom < min_headroom - 1e-9:         # (1.0 - 0.9) / 1.0 is 0.0999...98
        return Capture(base, ours, bound, ratio, headroom, None,
                       f"no headroom ({headroom:.0%} < {min_headroom:.0%} between "
                       "the baseline and the bound)")
    share = (base - ours) / (base - bound)
    note = "beyond the bound: check its inputs" if ours < bound else ""
    return Capture(base, ours, bound, ratio, headroom, share, note)


def class1(shared_s: float, alone_s: float, base_s: float | None = None,
           min_headroom: float = MIN_HEADROOM) -> dict:
    """A class-1 job's step beside other jobs against its alone time (its
    bound): ``{"vs_alone": shared / alone}``, and with the baseline (the same
    job beside the others under plain Horovod) the :class:`Capture` too."""
    out = {"vs_alone": _pos("shared step", shared_s) / _pos("alone step", alone_s)}
    if base_s is not None:
        out["capture"] = capture(base_s, shared_s, alone_s, min_headroom)
    return out


# ---------------------------------------------------------------- A/A resolution
@dataclass(frozen=True)
class Resolution:
    pairs: int
    diffs: tuple           # (A' - A) / A per pair, signed
    median: float          # median |diff|
    max: float             # max |diff|
    cv: float | None       # coefficient of variation of all runs (A and A')

    def text(self) -> str:
        return (f"A/A resolution over {self.pairs} pair(s): median {self.median:.1%}, "
                f"max {self.max:.1%}" + (f", cv {self.cv:.1%}" if self.cv is not None else ""))


def aa_resolution(pairs) -> Resolution:
    """``pairs``: (A, A') step times of identical runs, repeated and
    interleaved. The relative difference of each pair and their spread."""
    pairs = list(pairs)
    if not pairs:
        raise ValueError("A/A resolution needs at least one (A, A') pair")
    diffs = []
    for i, p in enumerate(pairs):
        if not isinstance(p, (tuple, list)) or len(p) != 2:
            raise ValueError(f"pair {i}: expected (A, A'), got {p!r}")
        a = _pos(f"pair {i} A", p[0])
        b = _pos(f"pair {i} A'", p[1])
        diffs.append((b - a) / a)
    absd = [abs(d) for d in diffs]
    runs = [x for p in pairs for x in p]
    cv = statistics.stdev(runs) / statistics.fmean(runs) if len(runs) > 2 else None
    return Resolution(len(pairs), tuple(diffs), statistics.median(absd), max(absd), cv)
