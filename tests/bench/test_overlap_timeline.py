"""benchmarks.traces.overlap_timeline: the barrier-crossing picture's data."""
import pytest

from benchmarks import traces


def _trace():
    us = 1_000_000
    evs = []
    for k in range(3):                      # three training calls of 1 s
        evs.append({"tid": "steps", "ph": "X", "ts": k * us, "dur": us - 1000, "name": f"step {k}"})
    # step 1's forward waits for task 1 (blocked) while step 0's chunk is reduced
    evs.append({"tid": "overlap wait", "ph": "X", "ts": us, "dur": 200_000,
                "args": {"task": 1, "blocked": True}, "cat": "overlap"})
    evs.append({"tid": "allreduce", "ph": "X", "cat": "chunk", "ts": 900_000, "dur": 300_000,
                "name": "allreduce opt_g1_float32_c0", "args": {"priority": 1}})
    evs.append({"tid": "overlap apply", "ph": "i", "ts": 1_200_000, "cat": "overlap",
                "args": {"task": 1}})
    evs.append({"tid": "allreduce", "ph": "X", "cat": "chunk", "ts": 5 * us, "dur": 1000,
                "name": "allreduce far_away", "args": {"priority": 0}})
    return evs


def test_timeline_of_two_calls():
    tl = traces.overlap_timeline(_trace(), first_step=1, nsteps=2)
    assert tl["calls"] == [(0.0, 0.999), (1.0, 1.999)]
    assert tl["waits"] == [(1, 0.0, 0.2, True)]
    assert tl["allreduces"] == [("opt_g1_float32_c0", 1, -0.1, 0.2)]   # began in the previous call
    assert tl["applies"] == [(1, 0.2)]


def test_too_few_steps_is_a_clear_error():
    with pytest.raises(ValueError, match="3 training steps"):
        traces.overlap_timeline(_trace(), first_step=2, nsteps=2)
