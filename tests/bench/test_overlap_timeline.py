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


def test_task_rows_one_per_task_when_few():
    rows = traces.task_rows([0, 2, 1, 2], max_rows=16)
    assert rows == {2: (0, "wait, task 2 (input side)"), 1: (1, "wait, task 1"),
                    0: (2, "wait, task 0")}


def test_task_rows_bin_many_tasks_input_side_first():
    rows = traces.task_rows(range(150), max_rows=16)
    assert len({r for r, _ in rows.values()}) <= 16
    assert rows[149] == (0, "wait, tasks 140-149 (input side)")
    assert rows[0][1] == "wait, tasks 0-9"
    # consecutive tasks share a row, rows go down towards the output side
    assert [rows[t][0] for t in range(149, -1, -1)] == sorted(rows[t][0] for t in range(150))
    with pytest.raises(ValueError, match="max_rows"):
        traces.task_rows([1], max_rows=0)


def test_plot_of_a_model_with_many_layers(tmp_path):
    import json
    evs = _trace()
    evs += [{"tid": "overlap wait", "ph": "X", "ts": 1_000_000 + 1000 * t, "dur": 500,
             "args": {"task": t, "blocked": t > 100}, "cat": "overlap"} for t in range(150)]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": evs}))
    out = traces.plot_overlap(path, tmp_path / "t.png", first_step=1, nsteps=2)
    assert out.stat().st_size > 1000
    from matplotlib import image
    h = image.imread(out).shape[0]
    assert h < 1500            # 16 rows of waits, not 150
