"""Adaptive priority policy: JP7042897B2 claims 1-4. Pure Python, no TensorFlow.

One :class:`AdaptivePriorityPolicy` per training job drives the per-group
priorities. The training loop calls, for every batch::

    policy.before_batch()            # claim 3: decay + reset when count > threshold
    ... train the batch, communicating gradients with policy.priorities ...
    policy.after_batch(seconds)      # claims 1, 2: min / count / boost update

Decision table of :meth:`after_batch` (``t`` = measured batch time,
``threshold = min + coefficient`` or ``min * (1 + relative_coefficient)``):

=========================  ==========================================  ===========
condition                  effect                                      outcome
=========================  ==========================================  ===========
first ``warmup_batches``   nothing                                     ``warmup``
next ``calibration_        recorded (auto threshold only, see below)   ``calibrate``
batches``
min unset or ``t < min``   ``min = t``, ``count += 1``                 ``new_min``
``min <= t < threshold``   ``count += 1``                              ``within``
``t >= threshold``         ``boost = min(boost + 1, max_boost)``       ``slow``
=========================  ==========================================  ===========

:meth:`before_batch`: if ``count > count_threshold`` then
``boost = max(boost - 1, 0)``, ``count = 0`` (outcome ``decay``).

The threshold's slack is the patent's preset coefficient (``threshold = min +
coefficient``), a relative one (``min * (1 + relative_coefficient)``), or,
when neither is given, measured: the first ``calibration_batches`` after the
warm-up are only recorded, then ``min`` is their minimum and the slack makes
the threshold ``median + 3 * (q90 - median) + 0.05 * median`` of them
(``coefficient`` = that - ``min``): the ordinary spread of a quiet run, even a
heavy-tailed one, does not count as slow, while a link shared with another
job's traffic adds far more. ``q90`` is the nearest-rank 90th percentile, but
never the largest of three or more batches (below ten that rank would be the
maximum): one slow batch in a short calibration cannot set the slack; and the
threshold is at most ``1.25 * median`` (:data:`MAX_MEASURED_SLACK`), so
several cannot either (a late warm-up step or a burst of another job's
traffic while calibrating).

"Raise the priority of the low-ranked tasks" (claims 1, 4) = add
``boost * step`` to the base priority of the last ``adjust_groups`` groups
(the low-ranked end of the sequence, see :mod:`horovod_prio.method.sequence`).

Every decision is recorded as a frozen :class:`PolicyEvent` in
``policy.events`` (bounded deque) and passed to the registered listeners.
"""
from __future__ import annotations

import collections
import math
import numbers
from dataclasses import dataclass
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple

__all__ = ["PolicyEvent", "AdaptivePriorityPolicy", "EVENT_KINDS"]

#: The measured threshold is at most this much above the calibration's median
#: (a relative share): slow steps inside the calibration window cannot lift it
#: above what another job's traffic adds.
MAX_MEASURED_SLACK = 0.25

#: Every ``PolicyEvent.kind``.
EVENT_KINDS = ("warmup", "calibrate", "new_min", "within", "slow", "decay")


@dataclass(frozen=True)
class PolicyEvent:
    """One decision of the policy; the state fields are taken *after* it.

    * ``kind`` - one of :data:`EVENT_KINDS`;
    * ``batch`` - 0-based index of the batch the decision belongs to (the
      number of :meth:`~AdaptivePriorityPolicy.after_batch` calls before it;
      for ``decay`` that is the batch about to start);
    * ``seconds`` - the measured batch time (``None`` for ``decay``);
    * ``min_batch_time``, ``threshold``, ``count``, ``boost``, ``priorities``
      - the policy state after the decision.
    """

    kind: str
    batch: int
    seconds: Optional[float]
    min_batch_time: Optional[float]
    threshold: Optional[float]
    count: int
    boost: int
    priorities: Tuple[int, ...]

    def as_dict(self) -> Dict:
        return {
            "kind": self.kind, "batch": self.batch, "seconds": self.seconds,
            "min_batch_time": self.min_batch_time, "threshold": self.threshold,
            "count": self.count, "boost": self.boost, "priorities": list(self.priorities),
        }


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _int_arg(name: str, value, minimum: int, maximum: Optional[int] = None) -> int:
    ok = _is_int(value) and value >= minimum and (maximum is None or value <= maximum)
    if not ok:
        rng = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ValueError(f"{name} must be an integer {rng}, got {value!r}")
    return int(value)


def _nonneg_float_arg(name: str, value) -> float:
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(float(value)) or value < 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


class AdaptivePriorityPolicy:
    """Claims 1-4 of JP7042897B2 over a group sequence.

    :param base_priorities: base priority of each group in sequence order
        (non-empty, strictly increasing - claim 5), e.g.
        :func:`horovod_prio.method.sequence.base_priorities`.
    :param coefficient: absolute slack in seconds: ``threshold = min + coefficient``.
    :param relative_coefficient: relative slack: ``threshold = min * (1 + rc)``.
        At most one of ``coefficient`` / ``relative_coefficient`` may be given;
        with neither, the slack is measured (``calibration_batches``).
    :param calibration_batches: with neither coefficient given: batches after
        the warm-up that measure the slack (``>= 1``).
    :param count_threshold: decay when ``count > count_threshold`` (claim 3).
    :param adjust_groups: how many groups, from the low-ranked end, are boosted
        (claim 4), ``1..N``.
    :param step: priority added per boost level (``>= 1``).
    :param max_boost: cap of the boost level (``>= 0``; 0 disables boosting).
    :param warmup_batches: leading batches ignored entirely (``>= 0``).
    :param max_events: bound of :attr:`events` (``>= 0``).

    Every invalid argument raises ``ValueError`` naming it.
    """

    def __init__(self, base_priorities: Sequence[int], *, coefficient: Optional[float] = None,
                 relative_coefficient: Optional[float] = None, count_threshold: int,
                 adjust_groups: int = 1, step: int = 1, max_boost: int,
                 warmup_batches: int = 1, calibration_batches: int = 20,
                 max_events: int = 10000) -> None:
        try:
            base = tuple(base_priorities)
        except TypeError:
            raise ValueError(
                f"base_priorities must be a non-empty sequence of integers, got {base_priorities!r}"
            ) from None
        if not base or not all(_is_int(p) for p in base):
            raise ValueError(
                f"base_priorities must be a non-empty sequence of integers, got {base_priorities!r}")
        if any(b <= a for a, b in zip(base, base[1:])):
            raise ValueError(f"base_priorities must be strictly increasing, got {list(base)!r}")
        self._base: Tuple[int, ...] = tuple(int(p) for p in base)

        if coefficient is not None and relative_coefficient is not None:
            raise ValueError(
                "at most one of coefficient and relative_coefficient may be given, got "
                f"coefficient={coefficient!r}, relative_coefficient={relative_coefficient!r}")
        self._auto = coefficient is None and relative_coefficient is None
        self._calibration_batches = _int_arg("calibration_batches", calibration_batches,
                                             1 if self._auto else 0)
        self._coefficient = None if coefficient is None else _nonneg_float_arg(
            "coefficient", coefficient)
        self._relative_coefficient = None if relative_coefficient is None else _nonneg_float_arg(
            "relative_coefficient", relative_coefficient)

        self._count_threshold = _int_arg("count_threshold", count_threshold, 0)
        self._adjust_groups = _int_arg("adjust_groups", adjust_groups, 1, len(self._base))
        self._step = _int_arg("step", step, 1)
        self._max_boost = _int_arg("max_boost", max_boost, 0)
        self._warmup_batches = _int_arg("warmup_batches", warmup_batches, 0)
        max_events = _int_arg("max_events", max_events, 0)

        self.events: Deque[PolicyEvent] = collections.deque(maxlen=max_events)
        self._listeners: List[Callable[[PolicyEvent], None]] = []
        self._last_event: Optional[PolicyEvent] = None
        self.reset()

    # ------------------------------------------------------------------ knobs
    @property
    def base_priorities(self) -> Tuple[int, ...]:
        return self._base

    @property
    def num_groups(self) -> int:
        return len(self._base)

    @property
    def coefficient(self) -> Optional[float]:
        """The absolute slack (measured after calibration when it was not given)."""
        return self._coefficient

    @property
    def auto_threshold(self) -> bool:
        """True when the slack is measured (neither coefficient given)."""
        return self._auto

    @property
    def calibration_batches(self) -> int:
        return self._calibration_batches

    @property
    def calibrating(self) -> bool:
        return self._auto and self._coefficient is None

    @property
    def relative_coefficient(self) -> Optional[float]:
        return self._relative_coefficient

    @property
    def count_threshold(self) -> int:
        return self._count_threshold

    @property
    def adjust_groups(self) -> int:
        return self._adjust_groups

    @property
    def step(self) -> int:
        return self._step

    @property
    def max_boost(self) -> int:
        return self._max_boost

    @property
    def warmup_batches(self) -> int:
        return self._warmup_batches

    # ------------------------------------------------------------------ state
    @property
    def min_batch_time(self) -> Optional[float]:
        """Shortest measured batch time (seconds); ``None`` until the first one."""
        return self._min

    @property
    def count(self) -> int:
        return self._count

    @property
    def boost(self) -> int:
        """Current boost level, always in ``[0, max_boost]``."""
        return self._boost

    @property
    def batches(self) -> int:
        """Number of :meth:`after_batch` calls (warm-up included) since reset."""
        return self._batches

    @property
    def threshold(self) -> Optional[float]:
        """``min + coefficient`` or ``min * (1 + relative_coefficient)``; ``None`` while min is."""
        if self._min is None or (self._coefficient is None and self._relative_coefficient is None):
            return None
        if self._coefficient is not None:
            return self._min + self._coefficient
        return self._min * (1.0 + self._relative_coefficient)

    @property
    def priorities(self) -> Tuple[int, ...]:
        """Current priority of each group: base, plus ``boost * step`` on the last
        ``adjust_groups`` groups."""
        first_adjusted = len(self._base) - self._adjust_groups
        extra = self._boost * self._step
        return tuple(p + extra if i >= first_adjusted else p for i, p in enumerate(self._base))

    @property
    def last_event(self) -> Optional[PolicyEvent]:
        return self._last_event

    # ------------------------------------------------------------- decisions
    def before_batch(self) -> bool:
        """Claim 3: if ``count > count_threshold``, lower the priority of the
        low-ranked groups (``boost - 1``, floor 0) and reset ``count`` to 0.

        Returns ``True`` (and records a ``decay`` event) when it did so.
        """
        if self._count > self._count_threshold:
            self._boost = max(self._boost - 1, 0)
            self._count = 0
            self._record("decay", None)
            return True
        return False

    def after_batch(self, seconds: float) -> str:
        """Claims 1 and 2: feed the measured training time of one batch.

        Returns the outcome: ``"warmup"``, ``"new_min"``, ``"within"`` or
        ``"slow"`` (see the module docstring). ``seconds`` must be a finite
        number >= 0, else ``ValueError`` naming ``seconds`` (state unchanged).
        """
        if (isinstance(seconds, bool) or not isinstance(seconds, numbers.Real)
                or not math.isfinite(float(seconds)) or seconds < 0):
            raise ValueError(f"seconds must be a finite number >= 0, got {seconds!r}")
        seconds = float(seconds)
        if self._batches < self._warmup_batches:
            kind = "warmup"
        elif self.calibrating:
            self._calibration.append(seconds)
            kind = "calibrate"
            if len(self._calibration) >= self._calibration_batches:
                self._calibrate()
        elif self._min is None or seconds < self._min:
            self._min = seconds
            self._count += 1
            kind = "new_min"
        elif seconds < self.threshold:
            self._count += 1
            kind = "within"
        else:
            self._boost = min(self._boost + 1, self._max_boost)
            kind = "slow"
        self._record(kind, seconds)
        self._batches += 1
        return kind

    def _calibrate(self) -> None:
        xs = sorted(self._calibration)
        n = len(xs)
        # the 90th percentile (nearest rank), but never the single largest of
        # three or more: below ten batches that rank is the maximum, and one
        # slow batch (a late warm-up step) would set the whole run's slack
        q90 = xs[min(int(math.ceil(0.9 * n)) - 1, n - 2) if n >= 3 else n - 1]
        median = xs[n // 2]
        self._min = xs[0]
        threshold = min(median + 3.0 * (q90 - median) + 0.05 * median,
                        (1.0 + MAX_MEASURED_SLACK) * median)
        self._coefficient = threshold - xs[0]

    # ---------------------------------------------------------------- events
    def add_listener(self, fn: Callable[[PolicyEvent], None]) -> Callable[[PolicyEvent], None]:
        """Call ``fn(event)`` for every future event; returns ``fn`` (decorator use).

        Listeners run synchronously after the state update; an exception from
        a listener propagates to the caller of before_batch/after_batch.
        """
        if not callable(fn):
            raise ValueError(f"fn must be callable, got {fn!r}")
        self._listeners.append(fn)
        return fn

    def remove_listener(self, fn: Callable[[PolicyEvent], None]) -> None:
        self._listeners.remove(fn)

    def _record(self, kind: str, seconds: Optional[float]) -> None:
        event = PolicyEvent(kind=kind, batch=self._batches, seconds=seconds,
                            min_batch_time=self._min, threshold=self.threshold,
                            count=self._count, boost=self._boost,
                            priorities=self.priorities)
        self.events.append(event)
        self._last_event = event
        for fn in list(self._listeners):
            fn(event)

    # ----------------------------------------------------------- whole state
    def state(self) -> Dict:
        """Plain-dict snapshot of the mutable state (plus derived values)."""
        return {
            "min_batch_time": self._min,
            "count": self._count,
            "boost": self._boost,
            "batches": self._batches,
            "threshold": self.threshold,
            "coefficient": self._coefficient,
            "priorities": list(self.priorities),
        }

    def load_state(self, state: Dict) -> None:
        """Restore ``min_batch_time``, ``count``, ``boost``, ``batches`` from
        :meth:`state` output (e.g. broadcast from rank 0). Validated."""
        mn = state["min_batch_time"]
        if mn is not None:
            mn = _nonneg_float_arg("state['min_batch_time']", mn)
        count = _int_arg("state['count']", state["count"], 0)
        boost = _int_arg("state['boost']", state["boost"], 0, self._max_boost)
        batches = _int_arg("state['batches']", state.get("batches", self._batches), 0)
        if self._auto and state.get("coefficient") is not None:
            self._coefficient = _nonneg_float_arg("state['coefficient']", state["coefficient"])
        self._min, self._count, self._boost, self._batches = mn, count, boost, batches

    def reset(self) -> None:
        """Back to the initial state (min unset, count 0, boost 0, warm-up again).

        The event log, ``last_event`` and the listeners are kept.
        """
        self._min: Optional[float] = None
        self._count = 0
        self._boost = 0
        self._batches = 0
        self._calibration: List[float] = []
        if getattr(self, "_auto", False):
            self._coefficient = None

    def __repr__(self) -> str:
        slack = (f"coefficient={self._coefficient}" if self._coefficient is not None
                 else f"relative_coefficient={self._relative_coefficient}"
                 if self._relative_coefficient is not None else "coefficient=<calibrating>")
        return (f"AdaptivePriorityPolicy(base_priorities={list(self._base)}, {slack}, "
                f"count_threshold={self._count_threshold}, adjust_groups={self._adjust_groups}, "
                f"step={self._step}, max_boost={self._max_boost}, "
                f"warmup_batches={self._warmup_batches}; min={self._min}, count={self._count}, "
                f"boost={self._boost})")
