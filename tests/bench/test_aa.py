"""benchmarks/aa.py, the A/A probe: its arguments, its plan and its statistics on
canned numbers (the measurement itself is not run here)."""
import sys
from pathlib import Path

import pytest

from benchmarks import aa
from benchmarks.cgroups import Limits


def test_arguments_and_defaults():
    a = aa.parse_args([])
    assert (a.pairs, a.rate, a.model, a.batch, a.threads, a.inter_threads, a.pin,
            a.rank_cgroup) == (5, "1gbit", "mlp", 256, 1, None, "none", None)
    a = aa.parse_args(["--pairs", "7", "--threads", "2", "--inter-threads", "3", "--pin", "rank",
                       "--rank-cgroup", "custom,cpu=0.45,period=10ms", "--steps", "2"])
    assert (a.pairs, a.threads, a.inter_threads, a.pin, a.steps) == (7, 2, 3, "rank", 2)
    assert a.rank_cgroup == ("custom", Limits(cpu=0.45, period_us=10000))
    spec = aa.job_spec(a)
    assert (spec.impl, spec.threads, spec.inter_threads, spec.pin_rank, spec.cpus) == (
        "horovod", 2, 3, True, None)
    assert aa.job_spec(aa.parse_args(["--pin", "job"])).cpus == "0"
    assert aa.job_spec(aa.parse_args([])).pin_rank is False


@pytest.mark.parametrize("argv, needle", [
    (["--pairs", "0"], "--pairs: expected an integer >= 1"),
    (["--threads", "x"], "--threads"),
    (["--pin", "core"], "--pin: invalid choice"),
    (["--rate", "fast"], "--rate: rate must be a rate"),
    (["--rank-cgroup", "huge"], "--rank-cgroup: rank cgroup 'huge': unknown kind"),
    (["--rank-cgroup", "custom,cpu=0"], "cpu must be a finite number > 0"),
    (["--rank-cgroup", "custom"], "sets no limit"),
    (["--pin", "rank", "--rank-cgroup", "custom,cpuset=1"], "cpuset and --pin rank"),
])
def test_bad_arguments_are_named(argv, needle, capsys):
    with pytest.raises(SystemExit):
        aa.parse_args(argv)
    assert needle in capsys.readouterr().err


def test_pairs_alternate_their_order():
    assert [(r["pair"], r["label"]) for r in aa.plan(3)] == [
        (0, "A"), (0, "A'"), (1, "A'"), (1, "A"), (2, "A"), (2, "A'")]


def _rec(pair, label, value, status="ok", error=None):
    return {"pair": pair, "label": label, "status": status, "s_per_step": value, "error": error}


def test_statistics_on_canned_runs():
    recs = [_rec(0, "A", 0.50), _rec(0, "A'", 0.51),
            _rec(1, "A'", 0.48), _rec(1, "A", 0.50),
            _rec(2, "A", 0.50), _rec(2, "A'", None, "failed", "job job0 exited with status 1\nx")]
    assert aa.pair_values(recs) == [(0.50, 0.51), (0.50, 0.48)]       # pair 2 incomplete
    text = aa.summary(recs)
    assert "| 1 | A A' | 0.5000 | 0.5100 | +2.0% |" in text
    assert "| 2 | A' A | 0.5000 | 0.4800 | -4.0% |" in text
    assert "| 3 | A A' | – | – | job job0 exited with status 1 |" in text
    assert "A/A resolution over 2 pair(s): median 3.0%, max 4.0%" in text
    assert aa.summary([_rec(0, "A", None, "failed", "boom")]).endswith(
        "A/A resolution: no complete pair")


def test_a_runs_value_is_the_median_of_its_measured_steps():
    steps = [{"step": 0, "warmup": True, "t_start": 0.0, "t_end": 5.0}] + [
        {"step": i, "t_start": t, "t_end": t + 0.4} for i, t in
        enumerate([5.0, 5.5, 6.1, 6.6, 7.3], start=1)]
    # cycles (to the next start): 0.5, 0.6, 0.5, 0.7 and the last step's own 0.4
    assert aa.step_time({"steps": steps}) == pytest.approx(0.5)
    assert aa.step_time({"steps": steps[:1]}) is None


def test_ranks_join_their_cgroups_through_the_wrapper(tmp_path):
    class FakeGroup:
        def __init__(self, files):
            self.files = files

        def procs_files(self, in_netns=False):
            assert in_netns                   # horovodrun runs inside ip netns exec
            return self.files

    enter = aa.enter_command([FakeGroup(["/c/r0/cgroup.procs", "/m/r0/cgroup.procs"]),
                              FakeGroup(["/c/r1/cgroup.procs"])])
    assert enter == [sys.executable, "-m", "benchmarks.cgroups", "enter",
                     "--rank", "0=/c/r0/cgroup.procs:/m/r0/cgroup.procs",
                     "--rank", "1=/c/r1/cgroup.procs", "--"]
    job = aa.job_spec(aa.parse_args(["--steps", "2"]))
    cmd = aa.rank_command(enter)(job, tmp_path)
    i = cmd.index("benchmarks.cgroups")
    assert "horovodrun" in Path(cmd[0]).name and "-np" in cmd[:i]
    assert cmd[i + len(enter) - 2:][:3] == [sys.executable, "-m", "benchmarks.workload"]
