"""The chunk plan: gradients -> tasks -> groups -> chunks. Pure Python.

One function, :func:`step_plan`, decides what one optimizer step sends: the
chunk size, the credit in force and whether a gradient may be cut follow from
the configuration, then :func:`make_plan` cuts the chunks with their priority
groups. The TensorFlow binding (``fusion.py``, ``overlapped.py``) builds its
graph from that plan and the simulator times the same plan, so both send
exactly the same chunks (``tests/method/test_step_plan.py``).

* A **task** is one layer's gradients (``tasks`` lists tensor indices per
  task, in backprop order: task 0 is the output-side layer).
* **Groups** partition the tasks (:func:`horovod_prio.method.sequence.partition_groups`).
* Within a group, the tensors (task order, then variable order) are fused per
  dtype into one virtual buffer, cut about every ``partition_bytes`` into
  **chunks**. A chunk is made of the tensor *segments* it covers, so it is
  ready as soon as the last tensor it covers is (it does not wait for the rest
  of its group), and the group buffer itself is never materialised.
* With ``split_tensors`` (a chunk may be held back: a credit or an arbiter,
  :meth:`~horovod_prio.method.config.PriorityConfig.splits_tensors`) a cut
  inside a tensor is moved back to the closest :data:`ALIGN_BYTES` boundary
  of that tensor, so the binding's slice of it is a view, not a copy.
  Without it a tensor is never cut, and one of at least half of
  ``partition_bytes`` is a chunk of its own; smaller tensors are fused up to
  ``partition_bytes``. The chunks leave as soon as they are ready, so cutting
  a tensor gains nothing (its pieces are ready together) while joining the
  reduced pieces costs a copy of it; and a fused chunk waits for its last
  tensor (with one inter-op thread TensorFlow computes the bias gradients
  after every weight gradient), which only small tensors, sharing the cost of
  a chunk, are worth (docs/bench.md, "Cutting a gradient costs a copy").
"""
from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["TensorSpec", "Segment", "Chunk", "Plan", "make_plan", "ALIGN_BYTES", "StepPlan",
           "step_plan"]

#: A cut inside a tensor falls on a multiple of this many bytes of the tensor:
#: TensorFlow's strided slice of a 1-D tensor is a view (no copy) when it
#: starts and ends on such a boundary (EIGEN_MAX_ALIGN_BYTES, at most 64).
ALIGN_BYTES = 64


@dataclass(frozen=True)
class TensorSpec:
    """One gradient: number of elements, dtype name and bytes per element."""

    nelems: int
    dtype: str = "float32"
    itemsize: int = 4


@dataclass(frozen=True)
class Segment:
    """Elements ``[offset, offset + length)`` of tensor ``tensor``, placed at
    ``chunk_offset`` in their chunk."""

    tensor: int
    offset: int
    length: int
    chunk_offset: int


@dataclass(frozen=True)
class Chunk:
    name: str
    group: int
    dtype: str
    itemsize: int
    segments: Tuple[Segment, ...]

    @property
    def nelems(self) -> int:
        return sum(s.length for s in self.segments)

    @property
    def nbytes(self) -> int:
        return self.nelems * self.itemsize

    @property
    def last_tensor(self) -> int:
        """The tensor whose readiness makes this chunk ready (the last one it
        covers in backprop order)."""
        return self.segments[-1].tensor


@dataclass(frozen=True)
class Plan:
    tasks: Tuple[Tuple[int, ...], ...]
    groups: Tuple[Tuple[int, ...], ...]
    chunks: Tuple[Chunk, ...]

    def pieces(self) -> Dict[int, List[Tuple[int, Segment]]]:
        """tensor index -> its ``(chunk index, segment)`` pieces, in order."""
        out: Dict[int, List[Tuple[int, Segment]]] = {}
        for c, chunk in enumerate(self.chunks):
            for seg in chunk.segments:
                out.setdefault(seg.tensor, []).append((c, seg))
        for lst in out.values():
            lst.sort(key=lambda cs: cs[1].offset)
        return out

    def group_of_tensor(self) -> Dict[int, int]:
        return {t: g for g, grp in enumerate(self.groups) for task in grp for t in self.tasks[task]}


def _cuts(sizes: List[int], starts: List[int], per_chunk: int, itemsize: int,
          split: bool) -> List[int]:
    """Chunk boundaries (element positions) in a group's virtual buffer of
    tensors of ``sizes`` elements starting at ``starts`` (one more entry: the
    total): ``[0, ..., total]``."""
    total = starts[-1]
    if not split:
        # Whole tensors: one of at least half a chunk alone, smaller ones fused
        # up to a chunk (they share the per-chunk cost).
        cuts, size = [0], 0
        for n in sizes:
            alone = 2 * n >= per_chunk
            if size and (alone or size + n > per_chunk):
                cuts.append(cuts[-1] + size)
                size = 0
            size += n
            if alone and size:
                cuts.append(cuts[-1] + size)
                size = 0
        return cuts + [total] if size else cuts
    align = ALIGN_BYTES // itemsize if ALIGN_BYTES % itemsize == 0 else 1
    cuts = [0]
    while cuts[-1] < total:
        target = cuts[-1] + per_chunk
        if target >= total:
            cuts.append(total)
            break
        t = bisect.bisect_right(starts, target) - 1       # the tensor the cut falls in
        snapped = starts[t] + (target - starts[t]) // align * align
        cuts.append(snapped if snapped > cuts[-1] else target)
    return cuts


def make_plan(tensors: Sequence[TensorSpec], tasks: Sequence[Sequence[int]],
              groups: Sequence[Sequence[int]], partition_bytes: int,
              prefix: str = "chunk", split_tensors: bool = True) -> Plan:
    """Cut the gradients into chunks (see the module docstring).

    ``tensors``: one :class:`TensorSpec` per gradient; ``tasks``: tensor
    indices per task, backprop order; ``groups``: task indices per group, in
    sequence order (``partition_groups``); ``partition_bytes``: the most bytes
    per chunk (at least one element), except that without ``split_tensors``
    a tensor bigger than that is one chunk. Chunk names are
    ``<prefix>_g<group>_<dtype>_c<n>`` (the Horovod tensor names: identical on
    every rank). Raises ``ValueError`` naming the argument on bad input.
    """
    if isinstance(partition_bytes, bool) or not isinstance(partition_bytes, int) \
            or partition_bytes < 1:
        raise ValueError(f"partition_bytes must be an integer >= 1, got {partition_bytes!r}")
    seen = [t for task in tasks for t in task]
    if sorted(seen) != sorted(set(seen)) or any(not 0 <= t < len(tensors) for t in seen):
        raise ValueError(f"tasks must list distinct tensor indices 0..{len(tensors) - 1}, "
                         f"got {tasks!r}")
    in_groups = [t for grp in groups for t in grp]
    if sorted(in_groups) != list(range(len(tasks))):
        raise ValueError(f"groups must partition the tasks 0..{len(tasks) - 1}, got {groups!r}")
    for i, spec in enumerate(tensors):
        if spec.nelems < 0 or spec.itemsize < 1:
            raise ValueError(f"tensors[{i}] must have nelems >= 0 and itemsize >= 1, got {spec!r}")
    chunks: List[Chunk] = []
    for g, grp in enumerate(groups):
        members = [t for task in grp for t in tasks[task]]
        by_dtype: Dict[str, List[int]] = {}
        for t in members:
            by_dtype.setdefault(tensors[t].dtype, []).append(t)
        for dtype, ts in by_dtype.items():
            itemsize = tensors[ts[0]].itemsize
            per_chunk = max(1, partition_bytes // itemsize)
            sizes = [tensors[t].nelems for t in ts]
            starts = [0, *itertools.accumulate(sizes)]
            cuts = _cuts(sizes, starts, per_chunk, itemsize, split_tensors)
            for c, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
                segs, pos = [], 0
                for t, off, n in zip(ts, starts, sizes):
                    a, b = max(lo, off), min(hi, off + n)
                    if a >= b:
                        continue
                    segs.append(Segment(t, a - off, b - a, pos))
                    pos += b - a
                chunks.append(Chunk("%s_g%d_%s_c%d" % (prefix, g, dtype, c), g, dtype, itemsize,
                                    tuple(segs)))
    return Plan(tuple(tuple(t) for t in tasks), tuple(tuple(g) for g in groups), tuple(chunks))


@dataclass(frozen=True)
class StepPlan:
    """What one optimizer step sends, decided by :func:`step_plan`.

    ``groups``: task indices per priority group; ``step_bytes``: the gradient
    bytes of a step; ``partition_bytes``: the chunk size; ``credit_bytes``:
    the scheduler credit this plan is made for (``None``: no limit) - under
    ``hvd.overlap`` the process's credit, which the runtime puts in force
    (:meth:`horovod_prio.runtime.Runtime.use_overlap_credit`); ``split_tensors``:
    whether a chunk may cut a gradient. :meth:`plan` cuts the chunks, named
    after ``prefix`` (the binding's is the identity name the runtime gives,
    which needs the groups and the chunk size first)."""

    tensors: Tuple[TensorSpec, ...]
    tasks: Tuple[Tuple[int, ...], ...]
    groups: Tuple[Tuple[int, ...], ...]
    step_bytes: int
    partition_bytes: int
    credit_bytes: Optional[int]
    split_tensors: bool

    def plan(self, prefix: str = "chunk") -> Plan:
        return make_plan(self.tensors, self.tasks, self.groups, self.partition_bytes,
                         prefix=prefix, split_tensors=self.split_tensors)


def step_plan(tensors: Sequence[TensorSpec], tasks: Sequence[Sequence[int]], config, *,
              overlap: bool = False, arbiter: Optional[bool] = None) -> StepPlan:
    """The chunk plan of one optimizer step under ``config`` (a
    :class:`~horovod_prio.method.config.PriorityConfig`), for the binding and
    the simulator alike.

    ``tensors``/``tasks`` as for :func:`make_plan`; groups from
    ``config.make_groups``; chunk size from ``config.partition_bytes_for``;
    credit ``config.overlap_credit_bytes(partition)`` when the step
    ``overlap``-s (``hvd.overlap``), else ``config.credit_bytes``; a gradient
    is cut where a chunk can be held back (``config.splits_tensors``), which
    an ``arbiter`` does (default: ``config.arbiter`` is set; the simulator
    says whether its job asks one)."""
    tensors = tuple(tensors)
    tasks = tuple(tuple(t) for t in tasks)
    groups = tuple(tuple(g) for g in config.make_groups(len(tasks)))
    step_bytes = sum(t.nelems * t.itemsize for t in tensors)
    partition = config.partition_bytes_for(step_bytes)
    credit = config.overlap_credit_bytes(partition) if overlap else config.credit_bytes
    if arbiter is None:
        arbiter = config.arbiter is not None
    return StepPlan(tensors, tasks, groups, step_bytes, partition, credit,
                    config.splits_tensors(credit, bool(arbiter)))
