"""A step's time in every benchmark table is its cycle: from its start to the
next step's start, so work between two batches (callbacks, a flush that
``hvd.overlap`` does for a callback) is counted, not hidden."""
import pytest

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


def test_cpu_per_step_is_measured_over_the_same_cycle():
    """rank-0 CPU s/step: the process's CPU time from one step's start to the
    next step's start (like the wall cycle), median over the measured steps;
    '–' for results recorded without CPU times."""
    job = {"steps": [
        {"step": 0, "t_start": 0.0, "t_end": 0.5, "cpu_start": 10.0, "cpu_end": 10.4, "warmup": True},
        {"step": 1, "t_start": 1.0, "t_end": 1.2, "cpu_start": 11.0, "cpu_end": 11.1, "warmup": False},
        {"step": 2, "t_start": 1.5, "t_end": 1.7, "cpu_start": 11.7, "cpu_end": 11.8, "warmup": False},
        {"step": 3, "t_start": 2.0, "t_end": 2.25, "cpu_start": 12.0, "cpu_end": 12.25, "warmup": False},
    ]}
    assert report.measured_cpu(job) == [pytest.approx(0.7), pytest.approx(0.3), pytest.approx(0.25)]
    stats = report.run_stats({"jobs": [dict(job, name="j", impl="prio")], "rate": "1gbit"})
    assert stats["jobs"][0]["cpu_median"] == pytest.approx(0.3)

    def run(impl, scale, repeat, cpu=True):
        steps = [dict(s, cpu_start=s["cpu_start"] * scale, cpu_end=s["cpu_end"] * scale)
                 if cpu else {k: v for k, v in s.items() if not k.startswith("cpu")}
                 for s in job["steps"]]
        return {"scenario": "a", "config": [impl], "rate": "1gbit", "batch": 32, "repeat": repeat,
                "status": "ok", "jobs": [{"name": "job0", "impl": impl, "steps": steps,
                                          "meta": {"model": "mlp"}}]}
    md = report.markdown({"meta": {}, "runs": [run("horovod", 1.0, 0), run("prio", 2.0, 0),
                                               run("horovod", 1.0, 1, cpu=False)]})
    rows = {line.split("|")[4].strip(): [c.strip() for c in line.split("|")]
            for line in md.splitlines() if line.startswith("| a |")}
    head = [c.strip() for c in md.splitlines()[2].split("|")]
    col = head.index("rank-0 CPU s/step")
    assert rows["prio"][col] == "0.600"        # twice hvd's CPU per step: 2 x 0.3 s
    assert rows["hvd"][col] == "0.300"         # the repeat without CPU times does not count
    md_old = report.markdown({"meta": {}, "runs": [run("horovod", 1.0, 0, cpu=False)]})
    assert [c.strip() for c in md_old.splitlines()[4].split("|")][col] == "–"
