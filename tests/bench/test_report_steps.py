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


def test_job_cpu_per_step_adds_up_every_rank_over_the_same_cycle():
    """job CPU s/step: each rank's process CPU time from one step's start to the
    next step's start (like the wall cycle), added up over the job's ranks,
    median over the measured steps; '–' where a rank's CPU times are missing
    (results recorded before them)."""
    rank0 = [
        {"step": 0, "t_start": 0.0, "t_end": 0.5, "cpu_start": 10.0, "cpu_end": 10.4, "warmup": True},
        {"step": 1, "t_start": 1.0, "t_end": 1.2, "cpu_start": 11.0, "cpu_end": 11.1, "warmup": False},
        {"step": 2, "t_start": 1.5, "t_end": 1.7, "cpu_start": 11.7, "cpu_end": 11.8, "warmup": False},
        {"step": 3, "t_start": 2.0, "t_end": 2.25, "cpu_start": 12.0, "cpu_end": 12.25, "warmup": False},
    ]
    rank1 = [{"step": i, "cpu_start": c, "cpu_end": c + 0.05, "warmup": i == 0}
             for i, c in enumerate([5.0, 5.2, 5.3, 5.5])]
    job = {"steps": rank0, "rank_cpu": {"1": rank1}, "meta": {"size": 2}}
    # rank 0: 0.7, 0.3, 0.25 (the last step to its own end); rank 1: 0.1, 0.2, 0.05
    assert report.measured_cpu(job) == [pytest.approx(0.8), pytest.approx(0.5),
                                        pytest.approx(0.3)]
    stats = report.run_stats({"jobs": [dict(job, name="j", impl="prio")], "rate": "1gbit"})
    assert stats["jobs"][0]["cpu_median"] == pytest.approx(0.5)
    # a rank without CPU times, or one missing altogether: no figure rather than a wrong one
    assert report.measured_cpu(dict(job, rank_cpu={})) == [None] * 3
    assert report.measured_cpu(dict(job, steps=[{k: v for k, v in s.items() if "cpu" not in k}
                                                for s in rank0])) == [None] * 3

    def run(impl, scale, repeat, cpu=True):
        def scaled(steps):
            return [dict(s, cpu_start=s["cpu_start"] * scale, cpu_end=s["cpu_end"] * scale)
                    if cpu else {k: v for k, v in s.items() if not k.startswith("cpu")}
                    for s in steps]
        return {"scenario": "a", "config": [impl], "rate": "1gbit", "batch": 32, "repeat": repeat,
                "status": "ok", "jobs": [{"name": "job0", "impl": impl, "steps": scaled(rank0),
                                          "rank_cpu": {"1": scaled(rank1)},
                                          "meta": {"model": "mlp", "size": 2}}]}
    md = report.markdown({"meta": {}, "runs": [run("horovod", 1.0, 0), run("prio", 2.0, 0),
                                               run("horovod", 1.0, 1, cpu=False)]})
    rows = {line.split("|")[4].strip(): [c.strip() for c in line.split("|")]
            for line in md.splitlines() if line.startswith("| a |")}
    head = [c.strip() for c in md.splitlines()[2].split("|")]
    col = head.index("job CPU s/step")
    assert rows["prio"][col] == "1.000"        # twice hvd's CPU per step: 2 x 0.5 s
    assert rows["hvd"][col] == "0.500"         # the repeat without CPU times does not count
    md_old = report.markdown({"meta": {}, "runs": [run("horovod", 1.0, 0, cpu=False)]})
    assert [c.strip() for c in md_old.splitlines()[4].split("|")][col] == "–"


def test_harness_collects_the_other_ranks_cpu_records(tmp_path):
    """The workload's ranks other than 0 write ``<job>.steps.jsonl.rank<r>``;
    the harness files them under the job, by rank, for the report."""
    from benchmarks import harness
    (tmp_path / "job0.steps.jsonl").write_text('{"step": 0}\n')
    (tmp_path / "job0.steps.jsonl.rank1").write_text('{"step": 0, "cpu_start": 1.0}\n')
    (tmp_path / "job0.steps.jsonl.rank3").write_text('{"step": 0, "cpu_start": 2.0}\n')
    (tmp_path / "job1.steps.jsonl.rank1").write_text('{"step": 0, "cpu_start": 9.0}\n')
    assert harness.rank_cpu(tmp_path, "job0") == {"1": [{"step": 0, "cpu_start": 1.0}],
                                                  "3": [{"step": 0, "cpu_start": 2.0}]}
    assert harness.rank_cpu(tmp_path, "job2") == {}
