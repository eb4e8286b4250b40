"""benchmarks.monitor_thresholds on a synthetic testbed result (no root, < 1 s)."""
import json

import pytest

from benchmarks import monitor_thresholds as mt


def _events(calib, done=True):
    ev = [{"name": "warmup", "args": {"kind": "warmup", "seconds": 2.0}}]
    ev += [{"name": "calibrate", "args": {"kind": "calibrate", "seconds": t, "threshold": None}}
           for t in calib]
    if done:        # the policy records the threshold it set in the last calibrate event
        ev[-1]["args"]["threshold"] = 0.8
        ev += [{"name": "slow", "args": {"kind": "slow", "seconds": 0.5}}]
    return ev


def _results(tmp_path, calib, unfinished=()):
    runs = [{"variant": "spec", "repeat": 0, "jobs": [{"trace_events": _events(calib)},
                                                      {"trace_events": []}]},
            {"variant": "hvd", "repeat": 0, "jobs": [{"steps": []}]}]
    if unfinished:
        runs.append({"variant": "spec", "repeat": 1,
                     "jobs": [{"trace_events": _events(unfinished, done=False)}]})
    d = tmp_path / "join-run"
    d.mkdir()
    (d / "results.json").write_text(json.dumps({"meta": {}, "runs": runs}))
    return d


def test_one_slow_calibration_step_blinded_the_old_rule_not_the_current_one(tmp_path, capsys):
    d = _results(tmp_path, [0.46, 0.30, 0.30, 0.27, 0.29], unfinished=[0.3, 1.9, 0.3])
    r, u = mt.rows([d])
    assert (r["variant"], r["repeat"], r["job"], r["n"], r["median"]) == ("spec", 0, 0, 5, 0.30)
    assert r["applied"] and not u["applied"] and u["n"] == 3
    assert r["before"] == pytest.approx(0.30 + 3 * 0.16 + 0.015)     # q90 = the 0.46
    assert r["now"] == pytest.approx(0.315)                          # the product's rule
    assert mt.main([str(d)]) == 0
    out = capsys.readouterr().out
    assert "| join-run | spec | 0 | 0 | 5 | yes | 0.300 | 0.795 (2.65x) | 0.315 (1.05x) |" in out
    assert "| join-run | spec | 1 | 0 | 3 | no |" in out
    assert ("1 applied calibrations (1 not finished in the run); threshold above 1.3 x the "
            "median: before 1, now 0") in out


def test_bad_input_is_named(tmp_path):
    with pytest.raises(SystemExit, match="cannot read"):
        mt.main([str(tmp_path / "missing")])
    with pytest.raises(SystemExit):
        mt.main([str(_results(tmp_path, [1.0])), "--above", "0.9"])
