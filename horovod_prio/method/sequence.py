"""Task sequence, group partition and base priorities (JP7042897B2, claim 5).

Pure Python; imports no TensorFlow.

Vocabulary (as in the patent):

* **task** - the gradient communication of all the parameters of one layer.
  The *parameter gradient communication task sequence* sorts the tasks in the
  direction of backpropagation, so **task 0 is the output-side layer** (its
  gradient is ready first) and task ``M-1`` is the input-side layer.
  :func:`task_sequence` turns a forward (input-first) layer list into it.
* **group** - a contiguous run of tasks. Priorities are set and adjusted per
  group (description, "group sequence"). :func:`partition_groups` splits the
  ``M`` tasks into ``N`` groups.
* **rank** in the sequence - group 0 is "high-ranked" (front of the
  sequence), the last group is "low-ranked". Claim 5: the priority of a
  high-ranking task is *lower* than that of a low-ranking task, so
  :func:`base_priorities` is strictly increasing along the sequence.
  Larger number = higher priority = sent earlier.
"""
from __future__ import annotations

import math
import numbers
from typing import Iterable, List, Sequence, TypeVar

__all__ = [
    "SCENES",
    "task_sequence",
    "partition_groups",
    "base_priorities",
    "task_priorities",
]

T = TypeVar("T")

#: The two partition scenes of the description when ``M / N <= ratio``.
SCENES = ("first", "tail")


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def task_sequence(layers: Iterable[T]) -> List[T]:
    """Return ``layers`` (forward, input-first order) in backprop order.

    The parameter gradient communication task sequence sorts the per-layer
    tasks in the direction of backpropagation (claim 5), i.e. the reversed
    forward order: element 0 of the result is the output-side layer. The
    input is not modified; any iterable is accepted, a new list is returned.
    """
    return list(reversed(list(layers)))


def partition_groups(num_tasks: int, num_groups: int, ratio_threshold: float = 2.0,
                     scene: str = "first") -> List[List[int]]:
    """Split tasks ``0..M-1`` into ``N`` contiguous, non-empty groups, in order.

    ``M = num_tasks``, ``N = num_groups``. Following the description:

    * if ``M / N > ratio_threshold``: ``N`` near-equal parts (sizes differ by at
      most 1; the larger parts come first);
    * otherwise, by ``scene``:

      - ``"first"``: group 0 gets ``M//N + M%N`` tasks, every other group
        ``M//N``;
      - ``"tail"``: each of the last ``N-1`` groups gets exactly one task (the
        last ``N-1`` tasks), group 0 gets all the rest.

    Returns a list of ``N`` lists of task indices. Raises ``ValueError`` naming
    the argument for non-int or ``< 1`` counts, ``N > M``, an unknown scene or
    ``ratio_threshold <= 0`` (or non-finite / non-number).
    """
    m = _check_int("num_tasks", num_tasks, 1)
    n = _check_int("num_groups", num_groups, 1)
    if n > m:
        raise ValueError(
            f"num_groups must be <= num_tasks ({m}), got {n}")
    if (isinstance(ratio_threshold, bool) or not isinstance(ratio_threshold, numbers.Real)
            or not math.isfinite(float(ratio_threshold)) or ratio_threshold <= 0):
        raise ValueError(
            f"ratio_threshold must be a finite number > 0, got {ratio_threshold!r}")
    if scene not in SCENES:
        raise ValueError(f"scene must be one of {SCENES}, got {scene!r}")

    if m / n > ratio_threshold:
        q, r = divmod(m, n)
        sizes = [q + 1] * r + [q] * (n - r)
    elif scene == "first":
        q, r = divmod(m, n)
        sizes = [q + r] + [q] * (n - 1)
    else:  # "tail"
        sizes = [m - (n - 1)] + [1] * (n - 1)

    groups: List[List[int]] = []
    start = 0
    for size in sizes:
        groups.append(list(range(start, start + size)))
        start += size
    assert start == m
    return groups


def base_priorities(num_groups: int) -> List[int]:
    """Base priority of each group: ``[0, 1, ..., N-1]``.

    Strictly increasing along the sequence (claim 5): group 0 (output side,
    high-ranked, gradients ready first) gets the lowest priority 0, the last
    group (input side, low-ranked, needed first by the next forward pass) the
    highest, ``N-1``. Raises ``ValueError`` naming ``num_groups`` if it is not
    an integer >= 1.
    """
    n = _check_int("num_groups", num_groups, 1)
    return list(range(n))


def task_priorities(groups: Sequence[Sequence[int]], priorities: Sequence[int]) -> List[int]:
    """Expand per-group ``priorities`` to a per-task list (task i -> priority).

    ``groups`` is the output of :func:`partition_groups`; ``priorities`` has one
    entry per group (e.g. ``AdaptivePriorityPolicy.priorities``).
    """
    if len(groups) != len(priorities):
        raise ValueError(
            f"priorities must have one entry per group ({len(groups)}), got {len(priorities)}")
    num_tasks = sum(len(g) for g in groups)
    out: List = [None] * num_tasks
    for group, prio in zip(groups, priorities):
        for task in group:
            if not 0 <= task < num_tasks or out[task] is not None:
                raise ValueError(f"groups must partition 0..{num_tasks - 1}, got {groups!r}")
            out[task] = prio
    return out
