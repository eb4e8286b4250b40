"""A step's time in every benchmark table is its cycle: from its start to the
next step's start, so work between two batches (callbacks, a flush that
``hvd.overlap`` does for a callback) is counted, not hidden."""
from benchmarks import report


def test_a_step_lasts_until_the_next_one_starts():
    job = {"steps": [
        {"step": 0, "t_start": 0.0, "t_end": 0.5, "warmup": True},
        {"step": 1, "t_start": 1.0, "t_end": 1.2, "warmup": False},
        {"step": 2, "t_start": 1.5, "t_end": 1.7, "warmup": False},   # 0.3 s between 1.2 and 1.5
        {"step": 3, "t_start": 2.0, "t_end": 2.25, "warmup": False},
    ]}
    assert report.measured_steps(job) == [(1.0, 1.5), (1.5, 2.0), (2.0, 2.25)]
    stats = report.run_stats({"jobs": [dict(job, name="j", impl="prio")], "rate": "1gbit"})
    assert stats["jobs"][0]["median"] == 0.5
