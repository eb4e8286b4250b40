"""Property-based tests (hypothesis) of the pure-Python core. Whole file < 20 s."""
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from horovod_prio.method.config import PriorityConfig
from horovod_prio.method.units import parse_bytes
from horovod_prio.method.policy import AdaptivePriorityPolicy
from horovod_prio.method.sequence import base_priorities, partition_groups, task_priorities

SETTINGS = settings(max_examples=150, deadline=None)

times = st.floats(min_value=0.0, max_value=100.0, allow_nan=False, allow_infinity=False)


@st.composite
def policies(draw):
    n = draw(st.integers(1, 8))
    use_abs = draw(st.booleans())
    coeff = draw(st.floats(0.0, 5.0, allow_nan=False))
    kw = dict(
        count_threshold=draw(st.integers(0, 6)),
        adjust_groups=draw(st.integers(1, n)),
        step=draw(st.integers(1, 5)),
        max_boost=draw(st.integers(0, 6)),
        warmup_batches=draw(st.integers(0, 3)),
    )
    if use_abs:
        kw["coefficient"] = coeff
    else:
        kw["relative_coefficient"] = coeff
    return AdaptivePriorityPolicy(base_priorities(n), **kw)


class Reference:
    """Straight transcription of claims 1-3 used as an oracle."""

    def __init__(self, p):
        self.p, self.min, self.count, self.boost, self.seen = p, None, 0, 0, 0

    def before(self):
        if self.count > self.p.count_threshold:
            self.boost = max(0, self.boost - 1)
            self.count = 0
            return True
        return False

    def after(self, t):
        self.seen += 1
        if self.seen <= self.p.warmup_batches:
            return "warmup"
        if self.min is None or t < self.min:
            self.min = t
            self.count += 1
            return "new_min"
        if self.p.coefficient is not None:
            thr = self.min + self.p.coefficient
        else:
            thr = self.min * (1 + self.p.relative_coefficient)
        if t < thr:
            self.count += 1
            return "within"
        self.boost = min(self.p.max_boost, self.boost + 1)
        return "slow"


@SETTINGS
@given(policies(), st.lists(times, max_size=60))
def test_policy_invariants(p, batch_times):
    base = p.base_priorities
    ref = Reference(p)
    first_adjusted = p.num_groups - p.adjust_groups
    for t in batch_times:
        assert p.before_batch() == ref.before()
        assert p.after_batch(t) == ref.after(t)
        assert (p.min_batch_time, p.count, p.boost) == (ref.min, ref.count, ref.boost)
        assert 0 <= p.boost <= p.max_boost
        assert p.count <= p.count_threshold + 1
        prio = p.priorities
        assert len(prio) == len(base)
        assert all(a >= b for a, b in zip(prio, base))            # never below base
        assert prio[:first_adjusted] == base[:first_adjusted]    # high-ranked untouched
        assert all(a - b == p.boost * p.step for a, b in zip(prio[first_adjusted:],
                                                            base[first_adjusted:]))
        assert all(x < y for x, y in zip(prio, prio[1:]))         # order preserved
        if p.min_batch_time is not None:
            assert p.threshold >= p.min_batch_time
            assert p.min_batch_time == min(batch_times[p.warmup_batches:p.batches])
    assert len(p.events) == len(batch_times) + sum(e.kind == "decay" for e in p.events)


@SETTINGS
@given(policies(), st.lists(st.tuples(st.booleans(), times), max_size=60))
def test_policy_bounds_with_arbitrary_call_order(p, ops):
    # even if before_batch is skipped sometimes, boost stays in range and
    # priorities never fall below base
    for call_before, t in ops:
        if call_before:
            p.before_batch()
        p.after_batch(t)
        assert 0 <= p.boost <= p.max_boost
        assert all(a >= b for a, b in zip(p.priorities, p.base_priorities))


@SETTINGS
@given(st.integers(1, 200))
def test_base_priorities_strictly_increasing(n):
    b = base_priorities(n)
    assert len(b) == n and all(x < y for x, y in zip(b, b[1:]))


@st.composite
def partition_args(draw):
    m = draw(st.integers(1, 300))
    n = draw(st.integers(1, m))
    ratio = draw(st.one_of(st.floats(0.01, 50.0, allow_nan=False), st.integers(1, 50)))
    scene = draw(st.sampled_from(["first", "tail"]))
    return m, n, ratio, scene


@SETTINGS
@given(partition_args())
@example((8, 4, 2.0, "tail"))     # M/N == ratio: the scene rule, not the equal split
@example((8, 4, 2, "first"))
@example((9, 4, 2.0, "tail"))
def test_partition_invariants(args):
    m, n, ratio, scene = args
    groups = partition_groups(m, n, ratio, scene)
    assert len(groups) == n
    assert all(groups)                                           # non-empty
    assert [t for g in groups for t in g] == list(range(m))      # complete, ordered
    assert all(g == list(range(g[0], g[-1] + 1)) for g in groups)  # contiguous
    sizes = [len(g) for g in groups]
    if m / n > ratio:
        assert max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)              # larger first
    elif scene == "first":
        assert sizes == [m // n + m % n] + [m // n] * (n - 1)
    else:
        assert sizes == [m - n + 1] + [1] * (n - 1)
    prio = task_priorities(groups, base_priorities(n))
    assert prio == sorted(prio)                                  # later tasks never lower


@SETTINGS
@given(st.integers(1, 50), st.integers(1, 50), st.integers(0, 100), st.integers(0, 10))
def test_config_env_roundtrip(num_groups, adjust, count_threshold, max_boost):
    environ = {"HOROVOD_PRIO_NUM_GROUPS": str(num_groups),
               "HOROVOD_PRIO_ADJUST_GROUPS": str(adjust),
               "HOROVOD_PRIO_COUNT_THRESHOLD": str(count_threshold),
               "HOROVOD_PRIO_MAX_BOOST": str(max_boost)}
    if adjust > num_groups:
        with pytest.raises(ValueError, match="adjust_groups"):
            PriorityConfig.from_env(environ)
        return
    c = PriorityConfig.from_env(environ)
    assert (c.num_groups, c.adjust_groups, c.count_threshold, c.max_boost) == \
        (num_groups, adjust, count_threshold, max_boost)
    for layers in (1, num_groups, num_groups + 3):
        p = c.make_policy(c.effective_num_groups(layers))
        assert 1 <= p.adjust_groups <= p.num_groups <= layers


@SETTINGS
@given(st.integers(0, 1 << 20), st.sampled_from([("B", 1), ("KiB", 1024), ("MiB", 1 << 20),
                                                  ("KB", 1000), ("MB", 10 ** 6), ("", 1)]))
def test_parse_bytes_suffixes(n, unit):
    suffix, mult = unit
    assert parse_bytes(f"{n}{suffix}") == n * mult
    assert math.isclose(parse_bytes(n), n)
