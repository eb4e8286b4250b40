"""Discrete-event simulator of K data-parallel jobs sharing one link.

Model (see docs/sim.md for the discussion):

* **One representative worker per job.** In synchronous data-parallel
  training with ring allreduce every worker of a job runs the same compute
  and sends/receives the same bytes at the same time, so one worker plus the
  link it sits on stands for all N; N enters only through the allreduce cost.
  That is why 1,000 workers cost no more to simulate than 2.
* **Compute**: forward over the layers, then backward in backprop order; the
  gradient of layer i is ready when its backward finishes. The next step
  starts when backward is done and every allreduce of the step has finished
  (Horovod's synchronous ``apply_gradients``) plus ``step_overhead``. With
  ``JobSpec.grad_order = "inline"`` (TensorFlow with one inter-op thread) the
  gradients come in the executor's order instead: the input side's first
  (:func:`gradient_ready`).
* **Allreduce cost** of S gradient bytes on N workers:
  ``2(N-1)*latency`` (one per ring hop, a pure delay that does not occupy the
  link) then ``link_bytes`` through the link, with
  ``link_bytes = 2(N-1)/N*S`` (``topology="nic"``: one NIC per worker, all
  jobs have one worker on every node) or ``2(N-1)*S`` (``topology="bus"``:
  all ranks of all jobs cross one link, e.g. a shaped loopback). Alone on the
  link that is the textbook ``2(N-1)/N*S/B + latency`` term. With ``mtu``
  the link also carries the frames' headers: ``link_bytes`` grows by
  ``(mtu + 14) / (mtu - 52)`` (TCP/IPv4 with timestamps over Ethernet; 1514
  bytes per 1448 of payload at MTU 1500), as a shaper counts them (the
  frame rule of :mod:`horovod_prio.sim.wire`, which the benchmarks' link
  floor uses too). Each collective
  also pays ``collective_overhead`` (Horovod's negotiation round and the
  per-op work of the ranks, measured on a testbed; default 0) before it
  occupies the link, holding the job's one collective slot meanwhile.
* **Horovod engine per job** (all modes): a background loop with a cycle
  time; each cycle takes every submitted tensor/chunk, fuses them in the
  order they came into buffers of at most ``fusion_threshold`` bytes, and
  executes the buffers one collective after the other (Horovod runs one
  collective at a time). A released chunk is one ``HorovodAllreduce`` tensor
  like any gradient: chunks released in the same cycle share a collective.
* **Priority release** (``priority``, ``arbiter``, ``adaptive``): the chunks
  are the product's chunk plan (:func:`horovod_prio.method.plan.step_plan`,
  the one the TensorFlow binding builds its graph from); a chunk is ready when
  the last layer it covers is. Each job drives its own instance of the
  product's C++ release scheduler (:class:`horovod_prio.scheduler.Scheduler`,
  through the C API) with the job's ``credit_bytes``: what the scheduler
  releases goes to the job's Horovod engine.
* **Link sharing**: the wire is always *fair shared*: the collectives on
  it split the bandwidth equally (processor sharing; TCP's per-flow fairness
  with one ring per job). In ``fifo`` and ``priority`` nothing else happens -
  nothing in Horovod lets one job yield to another. ``arbiter`` and
  ``adaptive`` add the cross-job arbiter: every job's ready chunks are
  requests; the arbiter grants the highest priority across jobs (ties by
  arrival) while granted-but-unfinished bytes on the link stay within
  ``arbiter_credit``, with a starvation bound; only granted chunks go to the
  job's Horovod engine. As in the product, the job's scheduler runs in
  external-grant mode: a chunk that passes the local rule is requested at the
  arbiter, which is the product's :class:`horovod_prio.arbiter.core.Arbiter`
  on the simulated clock, and the requests a completion unblocks reach the
  arbiter before the completion does. ``arbiter_rtt`` (default 0) is the
  job-to-arbiter round trip: a request and a completion reach the arbiter
  half of it after the job sent them, a grant reaches the job half of it
  after the arbiter decided. Each job's waits (request sent -> grant
  received, as the product's trace spans them) are in
  ``SimResult.grant_waits``.
* **Barrier crossing** (``JobSpec.overlap``, priority modes): as
  ``hvd.overlap`` - the next call starts when the backward pass ends and its
  forward reaches layer i only once layer i's chunks of the previous step are
  reduced; the credit defaults as the product's under overlap
  (:meth:`PriorityConfig.overlap_credit_bytes`); the last step ends at the
  final flush. The chunk size, in every priority mode, is the product's
  (:meth:`PriorityConfig.partition_bytes_for`).
* **Adaptive** (``adaptive``): one :class:`~horovod_prio.method.policy.
  AdaptivePriorityPolicy` per job (built by :meth:`PriorityConfig.make_policy`
  - the product's code), ``before_batch()`` at step start, ``after_batch(t)``
  with the job's measured step time; its ``priorities`` label the job's
  chunks, compared across jobs by the arbiter on one scale.
"""
from __future__ import annotations

import heapq
import itertools
import math
import numbers
import random
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

from ..arbiter.core import Arbiter
from ..method.config import PriorityConfig
from ..method.plan import step_plan
from ..method.sequence import base_priorities
from ..scheduler import UNLIMITED, Scheduler
from . import wire
from .profiles import Profile

MODES = ("fifo", "priority", "arbiter", "adaptive")
GRAD_ORDERS = ("backprop", "inline")
TOPOLOGIES = ("nic", "bus")
_EPS_BYTES = 1e-3


@dataclass
class LinkConfig:
    """The shared link and the Horovod engine knobs."""

    bandwidth: float = 10e9 / 8          # bytes/s
    latency: float = 5e-6                # s per ring hop
    topology: str = "nic"
    cycle_time: float = 1e-3             # Horovod >= 0.21 default
    fusion_threshold: int = 128 * 1024 * 1024  # Horovod >= 0.21 default
    starvation_bound: int = 8                  # arbiter CLI default
    arbiter_credit: int = 8 * 1024 * 1024      # arbiter CLI default (per link)
    arbiter_order: str = "burst"               # the arbiter's --order: "chunk" | "burst"
    arbiter_class_reserve: float = 0.0         # the arbiter's --class-reserve (its default: off)
    step_overhead: float = 0.0
    collective_overhead: float = 0.0           # s per collective before it occupies the link
    arbiter_rtt: float = 0.0                   # s, job <-> arbiter round trip
    mtu: int = 0                               # TCP over Ethernet frames of this MTU; 0: payload only

    def wire_factor(self) -> float:
        """Bytes the link carries per payload byte at ``mtu``: the frame rule of
        :mod:`horovod_prio.sim.wire` (1514 per 1448 at the Ethernet default of
        1500); 1 without framing."""
        return wire.wire_factor(self.mtu)

    def validate(self) -> None:
        def pos(name, v, strict=True):
            if (isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v)
                    or v < 0 or (strict and v == 0)):
                raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} 0, "
                                 f"got {v!r}")
        pos("bandwidth", self.bandwidth)
        pos("latency", self.latency, strict=False)
        pos("cycle_time", self.cycle_time, strict=False)
        pos("step_overhead", self.step_overhead, strict=False)
        pos("collective_overhead", self.collective_overhead, strict=False)
        pos("arbiter_rtt", self.arbiter_rtt, strict=False)
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)}, "
                             f"got {self.topology!r}")
        if self.arbiter_order not in Arbiter.ORDERS:
            raise ValueError(f"arbiter_order must be one of {', '.join(Arbiter.ORDERS)}, "
                             f"got {self.arbiter_order!r}")
        r = self.arbiter_class_reserve
        if isinstance(r, bool) or not isinstance(r, numbers.Real) or not 0 <= r < 1:
            raise ValueError(f"arbiter_class_reserve must be a number in [0, 1), got {r!r}")
        wire.check_mtu(self.mtu)
        for name in ("fusion_threshold", "starvation_bound", "arbiter_credit"):
            v = getattr(self, name)
            lo = 0 if name == "starvation_bound" else 1
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")


@dataclass
class JobSpec:
    profile: Profile
    workers: int
    steps: int
    start: float = 0.0
    name: str = ""
    jitter: float = 0.0   # compute time x U(1-jitter, 1+jitter) per step
    seed: int = 0
    #: measured per-step compute variation: seconds added to a step's compute (forward +
    #: backward, every layer stretched alike), one value drawn per step with replacement
    #: (seeded by ``seed`` and the job's index; empty: none). ``benchmarks.sim_check``
    #: fills it with a testbed run's step-to-step deviations (docs/sim.md)
    compute_noise: tuple = ()
    job_class: int = 0    # the job's priority class at the arbiter (HOROVOD_PRIO_JOB_PRIORITY)
    overlap: bool = False  # barrier crossing (hvd.overlap): see docs/sim.md
    #: the order the backward pass produces the gradients in (:data:`GRAD_ORDERS`,
    #: :func:`gradient_ready`): "backprop" (layer by layer from the output side) or
    #: "inline" (TensorFlow's executor with one inter-op thread)
    grad_order: str = "backprop"


@dataclass
class StepRecord:
    job: int
    step: int
    start: float
    end: float
    boost: int = 0          # boost in force during the step
    outcome: str = ""       # policy outcome; "slow" = boost raised, "slow-capped" = at max
    decayed: bool = False   # the decay before this step lowered the boost

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class SimResult:
    mode: str
    jobs: List[JobSpec]
    steps: List[List[StepRecord]]
    link_busy_s: float
    makespan: float
    events: int
    policy_events: List[List[dict]] = field(default_factory=list)
    #: per job: [(time, link bytes served so far)], one sample per step end
    link_served: List[List[tuple]] = field(default_factory=list)
    #: per job: [(start, end)] while it had a tensor or chunk handed to Horovod and
    #: not reduced (in the product's trace: the union of its "allreduce" spans)
    comm_spans: List[List[tuple]] = field(default_factory=list)
    #: per job: [(request sent, grant received, chunk bytes)] of every chunk it asked
    #: the arbiter for (in the product's trace: its "arbiter" spans, request -> grant)
    grant_waits: List[List[tuple]] = field(default_factory=list)
    arbiter_grants: int = 0
    starvation_grants: int = 0

    def step_times(self, job: int) -> List[float]:
        return [r.seconds for r in self.steps[job]]


class _Msg:
    __slots__ = ("job", "nbytes", "link_bytes", "units", "on_done", "remaining", "token")

    def __init__(self, job, nbytes, link_bytes, units, on_done):
        self.job, self.nbytes, self.link_bytes = job, nbytes, link_bytes
        self.units, self.on_done = units, on_done
        self.remaining = float(link_bytes)
        self.token = None


class _Sim:
    def __init__(self):
        self.now = 0.0
        self._heap = []
        self._seq = itertools.count()
        self.events = 0

    def at(self, t: float, fn: Callable, *args) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), fn, args))

    def run(self) -> None:
        heap = self._heap
        while heap:
            t, _, fn, args = heapq.heappop(heap)
            self.now = t
            self.events += 1
            fn(*args)


class _SharedLink:
    """Processor sharing: the n messages on the link each get bandwidth/n."""

    def __init__(self, sim: _Sim, bandwidth: float):
        self.sim, self.bw = sim, bandwidth
        self.active: List[_Msg] = []
        self.last = 0.0
        self.version = 0
        self.busy_s = 0.0
        self.served: Dict[int, float] = {}   # job index -> link bytes carried

    def _update(self):
        now = self.sim.now
        if self.active:
            dt = now - self.last
            share = dt * self.bw / len(self.active)
            for m in self.active:
                done = min(share, max(m.remaining, 0.0))
                m.remaining -= share
                self.served[m.job] = self.served.get(m.job, 0.0) + done
            self.busy_s += dt
        self.last = now

    def _reschedule(self):
        self.version += 1
        if self.active:
            rem = min(m.remaining for m in self.active)
            self.sim.at(self.sim.now + max(rem, 0.0) * len(self.active) / self.bw,
                        self._complete, self.version)

    def add(self, msg: _Msg):
        self._update()
        self.active.append(msg)
        self._reschedule()

    def _complete(self, version):
        if version != self.version:
            return
        self._update()
        done = [m for m in self.active if m.remaining <= _EPS_BYTES]
        if not done:  # float round-off: finish the smallest
            done = [min(self.active, key=lambda m: m.remaining)]
        self.active = [m for m in self.active if m not in done]
        self._reschedule()
        for m in done:
            m.on_done(m)


class _LinkArbiter:
    """The product's grant policy, :class:`horovod_prio.arbiter.core.Arbiter`,
    on the simulated clock (leases never expire); requests are the jobs'
    scheduler tickets."""

    def __init__(self, sim: "_Sim", credit: int, bound: int, order: str = "burst",
                 rtt: float = 0.0, class_reserve: float = 0.0):
        self.sim = sim
        self.core = Arbiter(credit_bytes=credit, lease_seconds=1e18, starvation_bound=bound,
                            clock=lambda: sim.now, order=order, class_reserve=class_reserve)
        self.handles: Dict[int, object] = {}
        self.jobs: Dict[int, "_Job"] = {}
        self.one_way = rtt / 2.0

    def _handle(self, job):
        h = self.handles.get(job.idx)
        if h is None:
            h = self.handles[job.idx] = self.core.register(str(job.idx), "link",
                                                           job_class=job.spec.job_class)
            self.jobs[job.idx] = job
        return h

    def _later(self, fn, *args):
        """``fn`` one way of the round trip later (at once without a round trip)."""
        if self.one_way > 0:
            self.sim.at(self.sim.now + self.one_way, fn, *args)
        else:
            fn(*args)

    def _deliver(self, grants):
        for r in grants or ():
            self._later(self.jobs[int(r.job.job_id)].granted, r.token)

    def join(self, job):
        """The job connects when it starts (as the product's job does), so a
        higher class counts from then on (the class reserve)."""
        self._handle(job)

    def leave(self, job):
        """The job finished its last step: it disconnects (the arbiter drops it)."""
        h = self.handles.pop(job.idx, None)
        if h is not None:
            self._later(lambda: self._deliver(self.core.drop(h)))

    def request(self, job, ticket: int, priority: int, nbytes: int, step: int = 0):
        h = self._handle(job)
        self._later(lambda: self._deliver(self.core.request(h, ticket, priority, nbytes,
                                                            step=step)))

    def done(self, job, ticket: int):
        h = self._handle(job)
        self._later(lambda: self._deliver(self.core.complete(h, ticket)))

    @property
    def starvation_grants(self) -> int:
        return sum(ln.c["starvation_grants"] for ln in self.core.links.values())

    @property
    def grants(self) -> int:
        return sum(ln.c["grants"] for ln in self.core.links.values())


class _Job:
    def __init__(self, idx: int, spec: JobSpec, sim: _Sim, link, cfg: LinkConfig,
                 pcfg: PriorityConfig, mode: str, records: List[StepRecord],
                 arbiter: Optional[_LinkArbiter] = None):
        self.idx, self.spec, self.sim, self.link, self.cfg, self.mode = (
            idx, spec, sim, link, cfg, mode)
        self.arbiter = arbiter
        self.records = records
        prof = spec.profile
        n = spec.workers
        # link bytes per gradient byte and per-message delay
        if n <= 1:
            self.byte_factor, self.delay = 0.0, 0.0
        else:
            self.byte_factor = _ring_factor(n, cfg.topology) * cfg.wire_factor()
            self.delay = 2.0 * (n - 1) * cfg.latency
        # forward layer order -> backprop order; ready offsets from step start
        fwd = prof.forward_s
        ready, t = gradient_ready(prof, spec.grad_order)   # per task, backprop order
        sizes: List[int] = [layer.params * prof.dtype_bytes
                            for layer in reversed(prof.layers) if layer.params > 0]
        self.compute_s = t
        self.task_ready, self.task_bytes = ready, sizes
        self.rng = random.Random(f"{spec.seed}:{idx}") if spec.jitter > 0 else None
        # its own stream, so that adding the measured noise leaves the jitter's draws alone
        self.noise = tuple(float(x) for x in spec.compute_noise)
        self.noise_rng = random.Random(f"{spec.seed}:{idx}:noise") if self.noise else None
        self.policy = None
        self.sched = None
        if mode != "fifo":
            # The product's chunk plan (its groups, chunk size and credit) and
            # release scheduler.
            tensors, tasks = prof.gradients()
            step = step_plan(tensors, tasks, pcfg, overlap=bool(spec.overlap),
                             arbiter=arbiter is not None)
            credit = step.credit_bytes
            plan = step.plan("job%d" % idx)
            # gradient -> its task (backprop order)
            self.task_of = {t: k for k, task in enumerate(tasks) for t in task}
            self.chunks = [(ready[self.task_of[c.last_tensor]], c.group, c.name, c.nbytes)
                           for c in plan.chunks]
            self.plan = plan
            self.base = tuple(base_priorities(len(plan.groups)))
            if mode == "adaptive":
                self.policy = pcfg.make_policy(len(plan.groups))
            self.sched = Scheduler()
            self.sched.configure(UNLIMITED if credit is None else credit, True)
            if arbiter is not None:
                self.sched.set_external_grant(True)
            self.ticket_bytes: Dict[int, int] = {}
        self.requested: Dict[int, float] = {}    # ticket -> when its request was sent
        self.grant_waits: List[tuple] = []
        self.served_log: List[tuple] = []
        self.overlap = bool(spec.overlap)
        if self.overlap:
            if mode == "fifo":
                raise ValueError("jobs[%d].overlap needs a priority mode (priority, arbiter, "
                                 "adaptive): hvd.overlap releases through horovod_prio's "
                                 "scheduler, got mode 'fifo'" % idx)
            # forward order: (forward seconds, task index or None)
            nt = len(sizes)
            self.fwd_layers = []
            k = 0
            for layer in prof.layers:
                task = None
                if layer.params > 0:
                    task = nt - 1 - k
                    k += 1
                self.fwd_layers.append((layer.forward_s, task))
            self.backward_total = t - fwd
            # the step whose update of each task is fully applied (-1: none yet)
            self.applied = [-1] * nt
            self.chunk_left: Dict[int, List[int]] = {}   # step -> per task chunks not done
            self.step_left: Dict[int, int] = {}          # step -> chunks not done
            self.ticket_step: Dict[int, tuple] = {}
            self.step_prios: Dict[int, tuple] = {}
            # task (backprop order) -> how many chunks hold a piece of it,
            # and chunk -> the tasks it holds pieces of
            self.chunk_tasks = [sorted({self.task_of[seg.tensor] for seg in c.segments})
                                for c in self.plan.chunks]
            self.task_nchunks = [0] * nt
            for held in self.chunk_tasks:
                for k in held:
                    self.task_nchunks[k] += 1
            self.fwd_wait = None
        # horovod engine state
        self.hq: List = []
        self.in_horovod = 0          # tensors/chunks submitted, not yet reduced
        self.comm_spans: List[tuple] = []
        self._comm_t0 = 0.0
        self.cycle_list: List[_Msg] = []
        self.busy = False
        self.tick_pending = False
        self.last_tick = spec.start
        self.step = 0

    # ---------------------------------------------------------- steps
    def start_step(self):
        now = self.sim.now
        if self.arbiter is not None and self.step == 0:
            self.arbiter.join(self)
        decayed = False
        if self.policy is not None:
            before = self.policy.boost
            decayed = self.policy.before_batch() and self.policy.boost < before
        self.prios = self.policy.priorities if self.policy is not None else (
            self.base if self.mode != "fifo" else ())
        if self.overlap:
            self.step_prios[self.step] = self.prios   # posted with the step
        self.step_start = now
        self.decayed = decayed
        self.bwd_done = False
        f = 1.0
        if self.rng is not None:
            f = 1.0 + self.spec.jitter * (2.0 * self.rng.random() - 1.0)
        if self.noise_rng is not None:
            d = self.noise_rng.choice(self.noise)
            if d:
                f *= 1.0 + d / self.compute_s
        self.f = f
        if self.overlap:
            self.chunk_left[self.step] = list(self.task_nchunks)
            self.step_left[self.step] = len(self.chunks)
            self._forward(0)
            return
        if self.mode == "fifo":
            self.outstanding = len(self.task_bytes)
            for i, (r, b) in enumerate(zip(self.task_ready, self.task_bytes)):
                self.sim.at(now + r * f, self.submit, (b, i, None))
        else:
            self.outstanding = len(self.chunks)
            for r, g, name, size in self.chunks:
                self.sim.at(now + r * f, self.chunk_ready_ev, g, name, size)
        self.sim.at(now + self.compute_s * f, self.backward_done)

    def backward_done(self):
        self.bwd_done = True
        if self.overlap:
            self._overlap_call_end()
            return
        self._maybe_end()

    # ---------------------------------------------------------- barrier crossing
    # As the product's hvd.overlap (docs/overlap.md): a training call returns
    # after its backward pass; the forward of layer i in step k+1 waits until
    # step k's update of layer i is applied (every chunk holding a piece of it
    # reduced; the update itself costs nothing here). Every layer with
    # gradients is waited on before step k+1's backward can produce its
    # chunks, so step k+1's chunks reach the scheduler only after all of step
    # k's are reduced - as the product's one background call per step, in
    # order (a chunk name is never in flight twice).
    def _forward(self, i):
        self.fwd_wait = None
        s = self.step
        while i < len(self.fwd_layers):
            secs, task = self.fwd_layers[i]
            if task is not None and self.applied[task] < s - 1:
                self.fwd_wait = i     # resumed by _chunk_done
                return
            if secs > 0:
                self.sim.at(self.sim.now + secs * self.f, self._forward, i + 1)
                return
            i += 1
        now, f, s = self.sim.now, self.f, self.step
        for ci, (r, g, name, size) in enumerate(self.chunks):
            self.sim.at(now + (r - self.spec.profile.forward_s) * f, self._take, s, ci)
        self.sim.at(now + self.backward_total * f, self.backward_done)

    def _take(self, s, ci):
        _, g, name, size = self.chunks[ci]
        prio = self.step_prios[s][g]
        ticket = self.sched.submit(name, prio, size)
        self.ticket_bytes[ticket] = (size, prio)
        self.ticket_step[ticket] = (s, ci)
        self._pump()

    def _chunk_done(self, ticket):
        s, ci = self.ticket_step.pop(ticket)
        left = self.chunk_left[s]
        for t in self.chunk_tasks[ci]:
            left[t] -= 1
            if left[t] == 0:
                self.applied[t] = s
        self.step_left[s] -= 1
        if self.step_left[s] == 0:
            del self.step_left[s], self.chunk_left[s], self.step_prios[s]
            if self.step >= self.spec.steps and not self.step_left:
                self._finish_last()
        if self.fwd_wait is not None:
            i = self.fwd_wait
            task = self.fwd_layers[i][1]
            if self.applied[task] >= self.step - 1:
                self._forward(i)

    def _overlap_call_end(self):
        self.bwd_done = False
        self.sim.at(self.sim.now + self.cfg.step_overhead, self._overlap_next)

    def _overlap_next(self):
        if self.step + 1 < self.spec.steps:
            self.end_step()           # records, starts the next call
        else:
            self.step += 1            # last call returned; its updates still pending
            if not self.step_left:
                self._finish_last()

    def _finish_last(self):
        # the final flush: the last step ends when its updates are applied
        self.step -= 1
        self.end_step()

    def _maybe_end(self):
        if not (self.bwd_done and self.outstanding == 0):
            return
        self.bwd_done = False  # once
        end = self.sim.now + self.cfg.step_overhead
        self.sim.at(end, self.end_step)

    def end_step(self):
        now = self.sim.now
        secs = now - self.step_start
        outcome = ""
        boost = 0
        if self.policy is not None:
            boost = self.policy.boost
            outcome = self.policy.after_batch(secs)
            if outcome == "slow" and self.policy.boost == boost:
                outcome = "slow-capped"   # already at max_boost: nothing raised
        self.records.append(StepRecord(self.idx, self.step, self.step_start, now, boost,
                                       outcome, self.decayed))
        self.link._update()   # bring the per-job byte counters to now
        self.served_log.append((now, self.link.served.get(self.idx, 0.0)))
        self.step += 1
        if self.step < self.spec.steps:
            self.start_step()
        elif self.arbiter is not None:
            self.arbiter.leave(self)

    # ---------------------------------------------------------- gate (the product's scheduler)
    def chunk_ready_ev(self, g, name, size):
        prio = self.prios[g]
        ticket = self.sched.submit(name, prio, size)
        self.ticket_bytes[ticket] = (size, prio)
        self._pump()

    def _pump(self):
        """Move what the scheduler decided: requests to the arbiter, releases to Horovod."""
        if self.arbiter is not None:
            for ticket, prio, size in self.sched.take_requests():
                self.requested[ticket] = self.sim.now
                self.arbiter.request(self, ticket, prio, size, self.step + 1)
        for ticket in self.sched.take_released():
            size, prio = self.ticket_bytes[ticket]
            self.submit((size, prio, ticket))

    def granted(self, ticket):
        self.grant_waits.append((self.requested.pop(ticket), self.sim.now,
                                 self.ticket_bytes[ticket][0]))
        self.sched.grant(ticket)
        self._pump()

    # ---------------------------------------------------------- horovod loop
    def submit(self, item):
        if self.in_horovod == 0:
            self._comm_t0 = self.sim.now
        self.in_horovod += 1
        self.hq.append(item)
        if not self.busy and not self.tick_pending:
            now = self.sim.now
            c = self.cfg.cycle_time
            if c <= 0:
                t = now
            else:
                k = max(1, math.ceil((now - self.last_tick) / c - 1e-9))
                t = self.last_tick + k * c
            self.tick_pending = True
            self.sim.at(max(t, now), self.tick)

    def tick(self):
        self.tick_pending = False
        self.last_tick = self.sim.now
        if not self.hq:
            return
        items, self.hq = self.hq, []
        # Horovod fuses the tensors of a cycle, in the order they came, into
        # buffers of at most fusion_threshold: plain gradients and released
        # chunks alike (a chunk is one HorovodAllreduce tensor)
        msgs = []
        buf, toks = 0, []
        for b, _, tok in items:
            if toks and buf + b > self.cfg.fusion_threshold:
                msgs.append(self._msg(buf, toks))
                buf, toks = 0, []
            buf += b
            toks.append(tok)
        msgs.append(self._msg(buf, toks))
        self.cycle_list = msgs
        self.busy = True
        self._run_next()

    def _msg(self, nbytes, tokens):
        m = _Msg(self.idx, nbytes, nbytes * self.byte_factor, len(tokens), self._msg_done)
        m.token = tokens
        return m

    def _run_next(self):
        if not self.cycle_list:
            self.busy = False
            nxt = max(self.sim.now, self.last_tick + self.cfg.cycle_time)
            self.tick_pending = True
            self.sim.at(nxt, self.tick)
            return
        msg = self.cycle_list.pop(0)
        delay = self.delay + self.cfg.collective_overhead
        if msg.link_bytes <= 0:
            self.sim.at(self.sim.now + delay, self._msg_done, msg)
        elif delay > 0:
            self.sim.at(self.sim.now + delay, self.link.add, msg)
        else:
            self.link.add(msg)

    def _msg_done(self, msg):
        self.in_horovod -= msg.units
        if self.in_horovod == 0:
            self.comm_spans.append((self._comm_t0, self.sim.now))
        if not self.overlap:
            self.outstanding -= msg.units
        if self.sched is not None:
            for ticket in msg.token:
                self.ticket_bytes.pop(ticket)
                self.sched.complete_ticket(ticket)
            # as in the product: the requests these completions unblock reach
            # the arbiter before the completions themselves
            self._pump()
            if self.arbiter is not None:
                for ticket in msg.token:
                    self.arbiter.done(self, ticket)
            if self.overlap:
                self._run_next()
                for ticket in msg.token:
                    self._chunk_done(ticket)
                return
        self._run_next()
        self._maybe_end()


def _check_noise(i: int, j: JobSpec) -> None:
    """jobs[i].compute_noise: finite seconds, none taking the step's compute to 0 or below."""
    noise = j.compute_noise
    if isinstance(noise, (str, bytes)) or not hasattr(noise, "__iter__"):
        raise ValueError(f"jobs[{i}].compute_noise must be a sequence of seconds, got {noise!r}")
    compute = gradient_ready(j.profile, j.grad_order)[1] if j.grad_order in GRAD_ORDERS else None
    for x in noise:
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x):
            raise ValueError(f"jobs[{i}].compute_noise must hold finite seconds, got {x!r}")
        if not x or compute is None:
            continue
        if compute <= 0:
            raise ValueError(f"jobs[{i}].compute_noise: {x!r} s on a job without compute time")
        if x <= -compute:
            raise ValueError(f"jobs[{i}].compute_noise: {x!r} s would leave a step no compute "
                             f"(the job's compute is {compute!r} s per step)")


def simulate(jobs: Sequence[JobSpec], mode: str, link: Optional[LinkConfig] = None,
             priority: Optional[PriorityConfig] = None) -> SimResult:
    """Run ``jobs`` on one shared link under ``mode`` (one of :data:`MODES`)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    link = link or LinkConfig()
    link.validate()
    pcfg = priority if priority is not None else PriorityConfig.from_env({})
    if not jobs:
        raise ValueError("jobs must not be empty")
    for i, j in enumerate(jobs):
        if isinstance(j.workers, bool) or not isinstance(j.workers, numbers.Integral) \
                or j.workers < 1:
            raise ValueError(f"jobs[{i}].workers must be an integer >= 1, got {j.workers!r}")
        if isinstance(j.steps, bool) or not isinstance(j.steps, numbers.Integral) or j.steps < 1:
            raise ValueError(f"jobs[{i}].steps must be an integer >= 1, got {j.steps!r}")
        if not (isinstance(j.start, numbers.Real) and math.isfinite(j.start) and j.start >= 0):
            raise ValueError(f"jobs[{i}].start must be a finite number >= 0, got {j.start!r}")
        if not (isinstance(j.jitter, numbers.Real) and 0 <= j.jitter < 1):
            raise ValueError(f"jobs[{i}].jitter must be a number in [0, 1), got {j.jitter!r}")
        _check_noise(i, j)
        if j.grad_order not in GRAD_ORDERS:
            raise ValueError(f"jobs[{i}].grad_order must be one of {', '.join(GRAD_ORDERS)}, "
                             f"got {j.grad_order!r}")
    sim = _Sim()
    ln = _SharedLink(sim, link.bandwidth)
    arb = None
    if mode in ("arbiter", "adaptive"):
        arb = _LinkArbiter(sim, link.arbiter_credit, link.starvation_bound, link.arbiter_order,
                           link.arbiter_rtt, link.arbiter_class_reserve)
    records: List[List[StepRecord]] = [[] for _ in jobs]
    js = [_Job(i, spec, sim, ln, link, pcfg, mode, records[i], arb)
          for i, spec in enumerate(jobs)]
    for j in js:
        sim.at(j.spec.start, j.start_step)
    sim.run()
    makespan = max((r[-1].end for r in records if r), default=0.0)
    pev = [[e.as_dict() for e in j.policy.events] if j.policy is not None else [] for j in js]
    label = mode + "+overlap" if any(j.overlap for j in jobs) else mode
    res = SimResult(label, list(jobs), records, ln.busy_s, makespan, sim.events, pev,
                    [j.served_log for j in js], [j.comm_spans for j in js],
                    [j.grant_waits for j in js])
    if arb is not None:
        res.arbiter_grants, res.starvation_grants = arb.grants, arb.starvation_grants
    return res


def gradient_ready(profile: Profile, order: str = "backprop"):
    """``(ready, compute_s)``: when each layer with parameters has its gradient,
    seconds from the step's start, in backprop order (output side first, as the
    tasks), and when the backward pass ends. Forward over the layers first, then
    the backward pass, whose length is the layers' ``backward_s`` in either order:

    * ``"backprop"``: layer by layer from the output side; a layer's gradient is
      ready when its backward ends.
    * ``"inline"``: TensorFlow's executor with one inter-op thread. It runs the
      chain of input gradients inline down to the first layer and the weight
      gradients queued beside it afterwards, the newest (input side) first. So
      each layer's backward splits into its input-gradient half and its
      weight-gradient half (a dense or convolution layer's two products cost
      the same); the chain of input-gradient halves runs first, output side
      first, then the weight-gradient halves from the input side, and a layer's
      gradient is ready when its weight-gradient half ends: the input side's
      gradient comes first and the output side's last."""
    if order not in GRAD_ORDERS:
        raise ValueError(f"grad_order must be one of {', '.join(GRAD_ORDERS)}, got {order!r}")
    t = profile.forward_s
    ready: List[float] = []
    if order == "backprop":
        for layer in reversed(profile.layers):
            t += layer.backward_s
            if layer.params > 0:
                ready.append(t)
        return ready, t
    # the input-gradient chain, then the weight gradients from the input side
    t += sum(0.5 * layer.backward_s for layer in profile.layers)
    for layer in profile.layers:
        t += 0.5 * layer.backward_s
        if layer.params > 0:
            ready.append(t)
    ready.reverse()
    return ready, t


def comm_floor(profile: Profile, workers: int, link: LinkConfig) -> float:
    """Seconds the link needs for one step's gradients of one job, alone:
    the allreduce bandwidth term (no latency, no compute)."""
    if workers <= 1:
        return 0.0
    return profile.grad_bytes * _ring_factor(workers, link.topology) * link.wire_factor() \
        / link.bandwidth


def _ring_factor(workers: int, topology: str) -> float:
    """Payload bytes a ring allreduce of one gradient byte puts on the link."""
    return 2.0 * (workers - 1) / workers if topology == "nic" else 2.0 * (workers - 1)


def overlap_window(result: SimResult):
    """``(t0, t1)``: from the last job's start to the first job's last step end
    - the interval in which every job is running (``None`` if empty)."""
    if not all(result.steps):
        return None
    t0 = max(r[0].start for r in result.steps)
    t1 = min(r[-1].end for r in result.steps)
    return (t0, t1) if t1 > t0 else None


def window_steps(result: SimResult, job: int, window=None, skip: int = 1) -> List[float]:
    """Step times of ``job`` lying fully inside ``window`` (default: the
    overlap window), after dropping the job's first ``skip`` steps."""
    w = overlap_window(result) if window is None else window
    recs = result.steps[job][skip:]
    if w is None:
        return [r.seconds for r in recs]
    return [r.seconds for r in recs if r.start >= w[0] and r.end <= w[1]]
