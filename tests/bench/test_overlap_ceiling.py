"""benchmarks/overlap_ceiling.py: the simulated gain of hvd.overlap per chunk setting."""
import json

import pytest

from benchmarks import overlap_ceiling as oc
from horovod_prio.sim.engine import LinkConfig
from horovod_prio.sim.profiles import Layer, Profile, save_profile

MIB = 1 << 20


def toy():
    return Profile("ov", (Layer("in", MIB // 16, 0.1, 0.1), Layer("mid", MIB // 16, 0.1, 0.1),
                          Layer("out", 2 * MIB, 0.1, 0.1)), 8)


def test_grid_matches_the_simulator_and_names_the_best():
    link = LinkConfig(bandwidth=16 * MIB, latency=0.0, cycle_time=0.0, topology="nic")
    res = oc.ceiling(toy(), 2, link, 12, [MIB, 4 * MIB], [None, MIB])
    by = {(g["partition_bytes"], g["credit_bytes"]): g for g in res["grid"]}
    # tests/sim/test_sim.py derives these two by hand
    assert res["hvd_step_s"] == pytest.approx(0.93125, rel=1e-9)
    assert by[(MIB, MIB)]["step_s"] == pytest.approx(0.73125, rel=1e-9)
    assert by[(MIB, None)]["speedup"] == pytest.approx(1.0, rel=1e-9)
    assert res["best"] is by[(MIB, MIB)]
    assert res["bound_speedup"] == pytest.approx(0.93125 / 0.6, rel=1e-9)
    # per layer: in 1/64 + 0.6; mid 2/64 + 0.4; out (all 8.5 MiB) 0.53125 + 0.2
    assert res["per_layer_bound_s"] == pytest.approx(0.73125, rel=1e-9)
    assert res["per_layer_bound_speedup"] == pytest.approx(0.93125 / 0.73125, rel=1e-9)
    text = oc.table(res, [MIB, 4 * MIB], [None, MIB])
    assert "| 1 MiB | 1.00x | **1.27x** |" in text


def test_fit_scale_reproduces_the_measured_plain_step():
    link = LinkConfig(bandwidth=16 * MIB, topology="bus")
    k = oc.fit_scale(toy(), 2, link, 10, 2.5)
    # within Horovod's 1 ms cycle (the simulated step moves in its steps)
    assert oc.plain_step(toy().scaled(k), 2, link, 10) == pytest.approx(2.5, abs=2e-3)
    with pytest.raises(ValueError, match="hvd-step"):
        oc.fit_scale(toy(), 2, link, 10, 0.01)   # below the link floor


def test_cli_writes_tables_and_names_bad_flags(tmp_path, capsys):
    prof = tmp_path / "p.json"
    save_profile(toy(), str(prof))
    out = tmp_path / "o"
    rc = oc.main(["--profile", str(prof), "--rate", "128mbit", "--topology", "nic",
                  "--partitions", "1MiB", "--credits", "none,1MiB", "--steps", "8",
                  "--out", str(out)])
    assert rc == 0
    data = json.loads((out / "ceiling.json").read_text())
    assert len(data["grid"]) == 2 and data["compute_scale"] == 1.0
    assert data["date"].startswith("20") and "git" in data     # for results/README.md
    # 8.5 MiB of gradients, 2 ranks on their own NICs: 8.5 MiB cross each at 128 Mbit/s,
    # in frames of the testbed uplink's MTU (what --topology nic stands for)
    assert data["mtu"] == 1500
    assert data["link_floor_s"] == pytest.approx(8.5 * MIB * 1514 / 1448 * 8 / 128e6, rel=1e-9)
    assert "link floor in wire bytes at MTU 1500" in (out / "ceiling.md").read_text()
    assert "| 1 MiB |" in (out / "ceiling.md").read_text()
    # --mtu 0: payload only; bus (the harness's shaped lo) defaults to lo's MTU
    assert oc.main(["--profile", str(prof), "--rate", "128mbit", "--topology", "nic",
                    "--mtu", "0", "--partitions", "1MiB", "--credits", "none", "--steps", "8",
                    "--out", str(out)]) == 0
    data = json.loads((out / "ceiling.json").read_text())
    assert data["link_floor_s"] == pytest.approx(8.5 * MIB * 8 / 128e6, rel=1e-9)
    assert oc.default_mtu("bus") == 65536 and oc.default_mtu("nic") == 1500
    for argv, flag in ((["--credits", "lots"], "--credits"),
                       (["--partitions", "0"], "--partitions"),
                       (["--hvd-step", "-1"], "--hvd-step"),
                       (["--mtu", "67"], "--mtu")):
        with pytest.raises(SystemExit):
            oc.main(["--profile", str(prof), "--rate", "128mbit"] + argv)
        assert flag in capsys.readouterr().err
    with pytest.raises(SystemExit):
        oc.main(["--profile", str(tmp_path / "missing.json"), "--rate", "128mbit"])
    assert "--profile" in capsys.readouterr().err
    # a built-in model by name
    assert oc.main(["--profile", "resnet50", "--rate", "10gbit", "--workers", "8",
                    "--topology", "nic", "--partitions", "4MiB", "--credits", "4MiB",
                    "--steps", "4"]) == 0
    assert "resnet50, batch 64, 8 ranks" in capsys.readouterr().out
