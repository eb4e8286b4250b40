"""benchmarks/heter_dlrm.py: the harness logic that can be wrong without a
measurement -- table sizes, the byte bounds from the ids drawn, the summary
and its table, the OOM-is-a-result path, the CLI's errors. No timing."""
import os
import shutil
import subprocess

import numpy as np
import pytest

from benchmarks import heter_dlrm as hd
from stack_required import needs


# ------------------------------------------------------------------ sizes and data
def test_table_rows_follow_criteo_and_reach_the_size():
    rows = hd.table_rows(1.0, 16, 4)
    assert len(rows) == 26
    assert abs(sum(rows) * 16 * 4 - 1e9) < 1e6               # ~1 GB of float32 rows
    assert min(rows) == 4 and rows.index(max(rows)) == hd.CRITEO_ROWS.index(max(hd.CRITEO_ROWS))
    assert sum(hd.table_rows(0.1, 16, 4)) < sum(rows) / 5


def test_batches_are_zipf_ids_inside_the_tables_and_the_same_every_time():
    a = hd.parse_args(["--quick", "--batch", "64", "--pool", "2"])
    cfg = hd.model_config(a)
    one, two = hd.draw_batches(cfg), hd.draw_batches(cfg)
    assert len(one) == 2
    for (x, y), (x2, _) in zip(one, two):
        assert set(x) == {"c%d" % i for i in range(26)} | {"dense"}
        assert x["dense"].shape == (64, 13) and y.shape == (64, 1)
        for i, r in enumerate(cfg["rows"]):
            ids = x["c%d" % i]
            assert ids.shape == (64, cfg["hot"][i]) and ids.min() >= 0 and ids.max() < r
            assert np.array_equal(ids, x2["c%d" % i])
        big = int(np.argmax(cfg["rows"]))
        ids = x["c%d" % big]
        assert len(np.unique(ids)) < ids.size                  # Zipf: hot ids repeat


# ------------------------------------------------------------------ bounds
def test_heter_bound_counts_the_unique_ids_of_the_remote_shard():
    batch = {"c0": np.array([[0, 1], [1, 3]]), "c1": np.array([[2, 2], [5, 6]])}
    # one sparse trainer beside shard 0, unpooled: remote shard 1 (odd ids, mod 2) gets
    # c0 -> {1, 3}, c1 -> {5}; 8 lookups of 4 floats cross as activations
    b = hd.heter_bound(batch, rows=[10, 7], dim=4, sparse_trainers=1, pooled=False)
    assert b["unique_remote_rows"] == 3
    assert (b["keys"], b["rows"], b["row_grads"]) == (24, 48, 48)
    assert (b["activations"], b["activation_grads"]) == (128, 128)
    assert b["uplink"] == 256 and b["fabric"] == 24 + 96 + 256
    # two trainers, trainer s beside shard s, one sample each: trainer 0 sends c0's 1 to
    # shard 1, trainer 1 sends c1's 6 to shard 0; pooled: 2 samples x 2 fields x 4 floats
    b = hd.heter_bound(batch, rows=[10, 7], dim=4)
    assert b["unique_remote_rows"] == 2 and b["activations"] == 2 * 2 * 4 * 4
    assert b["uplink"] == 128 and b["fabric"] == 16 + 64 + 128


def test_hot_sizes_and_the_heter_layouts():
    assert hd.parse_hot("3") == [3] * 26
    assert hd.parse_hot("mlperf") == list(hd.MLPERF_HOT) and sum(hd.MLPERF_HOT) == 214
    for bad in ("0", "x"):
        with pytest.raises(Exception, match="--hot: expected a positive integer or 'mlperf'"):
            hd.parse_hot(bad)
    two = hd.heter_layout(2)
    assert two["roles"] == "sparse=0+2,ps=1+3,dense=[4]" and two["np"] == 5
    assert ("sparse", "a2") in two["where"] and ("sparse", "a1") in two["where"]
    assert hd.heter_layout(1)["where"].count(("sparse", "a1")) == 1
    a = hd.parse_args(["--quick", "--hot", "mlperf", "--batch", "16", "--pool", "1"])
    cfg = hd.model_config(a)
    x, _ = hd.draw_batches(cfg)[0]
    assert [x["c%d" % i].shape[1] for i in range(26)] == list(hd.MLPERF_HOT)
    # threads per rank: the host's CPU limit rounded up, the same for both systems
    assert cfg["threads"] == {"a1": 1, "a2": 1, "b1": 2}


def test_heter_bound_rejects_an_id_outside_its_table():
    with pytest.raises(ValueError, match="input 'c1': ids outside table rows 0-6"):
        hd.heter_bound({"c0": np.array([[0]]), "c1": np.array([[7]])}, [10, 7], 4)


def test_plain_bound_is_the_allreduce_and_the_allgather():
    batch = {"c0": np.array([[0, 1], [1, 3]]), "c1": np.array([[2, 2], [5, 6]])}
    b = hd.plain_bound(batch, [10, 7], dim=4, dense_params=100, ranks=3)
    assert b["dense_allreduce"] == 2 * 2 * 400
    assert b["sparse_allgather"] == 2 * 8 * (8 + 16)
    assert b["fabric"] == 1600 + 384


@pytest.mark.tf_stack
def test_dense_param_count_matches_the_keras_model():
    cfg = hd.model_config(hd.parse_args(["--quick", "--table-gb", "0.0001"]))
    model = hd.build_model(cfg)
    dense = sum(int(np.prod(v.shape)) for v in model.trainable_variables
                if not v.name.startswith("table"))
    assert hd.dense_param_count(cfg) == dense


# ------------------------------------------------------------------ summary and table
def _run(system, rate, rep, sps, status="ok", scenario="throughput"):
    r = {"system": system, "rate": rate, "repeat": rep, "status": status,
         "scenario": scenario, "error": None if status == "ok" else "boom"}
    if status == "ok":
        r.update(samples_per_s=sps, s_per_step=512 / sps, uplink_bytes_per_step=1e6,
                 fabric_bytes_per_step=2e6,
                 peak_rss_by_role={"replica": 3 << 30} if system == "plain" else
                 {"ps": 2 << 30, "sparse": 1 << 30, "dense": 1 << 29})
    return r


def _results():
    cfg = hd.model_config(hd.parse_args(["--quick"]))
    runs = [_run("plain", "300mbit", 0, 100.0), _run("heter", "300mbit", 0, 300.0),
            _run("heter", "300mbit", 1, 100.0), _run("plain", "300mbit", 1, 50.0),
            _run("plain", "300mbit", 2, 50.0), _run("heter", "300mbit", 2, 0, status="failed"),
            _run("plain", "1gbit", 0, 0, status="oom"), _run("heter", "1gbit", 0, 200.0),
            dict(_run("plain", "unshaped", 0, 0, status="oom", scenario="cap"),
                 host_peak={"b1": 1 << 30}, oom_kills={"b1": 1}),
            dict(_run("heter", "unshaped", 0, 250.0, scenario="cap"),
                 host_peak={"b1": 700 << 20}, oom_kills={"b1": 0})]
    meta = {"what": "test", "command": "python -m benchmarks.heter_dlrm --x", "date": "d",
            "git": "abc1234", "machine": "box", "ncpu": 2, "loadavg_before": 1.0,
            "loadavg_after": 2.0, "rates": ["300mbit", "1gbit"], "repeats": 3, "config": cfg,
            "table_bytes": 10 ** 8, "dense_params": 1000, "cap_memory": 900 << 20,
            "cap_rate": "unshaped",
            "bounds": {"heter": {"uplink": 3e6, "fabric": 5e6}, "plain": {"fabric": 9e6}}}
    return {"meta": meta, "runs": runs}


def test_summary_takes_the_median_of_per_repeat_ratios():
    s = hd.summarize(_results())
    r = s["300mbit"]
    # repeat 0: 3.0, repeat 1: 2.0, repeat 2: heter failed -> not a pair (the ratio of
    # the medians would be 200 / 50 = 4.0)
    assert r["ratio"] == {"median": 2.5, "min": 2.0, "max": 3.0, "n": 2}
    assert r["plain"]["samples_per_s"] == 50.0 and r["heter"]["samples_per_s"] == 200.0
    assert (r["heter"]["runs_ok"], r["heter"]["runs"]) == (2, 3)
    assert r["heter"]["statuses"] == ["failed", "ok"]
    assert r["heter"]["peak_rss_by_role"] == {"ps": 2 << 30, "sparse": 1 << 30, "dense": 1 << 29}
    g = s["1gbit"]
    assert g["ratio"] is None and g["plain"]["samples_per_s"] is None
    assert g["plain"]["statuses"] == ["oom"]


def test_table_and_files(tmp_path):
    res = _results()
    hd.write_outputs(res, tmp_path)
    md = (tmp_path / "results.md").read_text()
    assert "Command: `python -m benchmarks.heter_dlrm --x`" in md
    assert "git abc1234" in md and "1.00 before, 2.00 after" in md
    row = [ln for ln in md.splitlines() if ln.startswith("| 300mbit")][0]
    assert "| 50.0 | 200.0 | 2.50× (2.00–3.00) |" in row
    # the uplink's bound as wire bytes (frames of the testbed's MTU, 1514 bytes per
    # 1448: tbf counts them); the fabric's as payload (the veth counters see
    # offloaded super-packets)
    assert "(9.00 MB)" in row and "(3.14 MB, 5.00 MB)" in row
    assert "(bound uplink, wire bytes at MTU 1500; fabric, payload)" in md
    res["meta"]["mtu"] = 0                                      # as recorded: payload only
    hd.write_outputs(res, tmp_path)
    md0 = (tmp_path / "results.md").read_text()
    assert "(9.00 MB)" in md0 and "(3.00 MB, 5.00 MB)" in md0
    assert "(bound uplink, payload bytes (no framing); fabric, payload)" in md0
    res["meta"].pop("mtu")
    hd.write_outputs(res, tmp_path)
    assert "3.00 GiB" in row and "2.00 GiB / 1.00 GiB / 0.50 GiB" in row and "| 3/3, 2/3 |" in row
    assert "| 1gbit | – | 200.0 | – |" in md
    cap = [ln for ln in md.splitlines() if ln.startswith("| plain | oom")]
    assert cap and "| 1.00 GiB | 1 |" in cap[0]
    assert "| heter | ok | 250.0 |" in md
    from benchmarks import results_io
    data = results_io.load(tmp_path)
    assert data["summary"]["300mbit"]["ratio"]["median"] == 2.5
    assert os.path.getsize(tmp_path / "results.json.gz") < 100_000
    # the results index reads what it needs from the folder
    from benchmarks import results_index
    info = results_index.describe(tmp_path)
    assert info["git"] == "abc1234" and info["command"].startswith("python -m benchmarks.heter")


def test_status_oom_is_a_result_not_a_failure():
    assert hd.run_status(0, {"a1": 0, "b1": 0}, False) == "ok"
    assert hd.run_status(1, {"a1": 0, "b1": 0}, False) == "failed"
    assert hd.run_status(137, {"a1": 0, "b1": 1}, False) == "oom"
    assert hd.run_status(None, {"b1": 2}, True) == "oom"
    assert hd.run_status(None, {"b1": 0}, True) == "timeout"


def test_auto_cap_is_between_the_two_systems_peaks():
    runs = [dict(system="plain", scenario="throughput", status="ok", host_peak={"b1": 3000}),
            dict(system="plain", scenario="throughput", status="ok", host_peak={"b1": 2800}),
            dict(system="heter", scenario="throughput", status="ok", host_peak={"b1": 1000}),
            dict(system="heter", scenario="throughput", status="failed", host_peak={"b1": 9999})]
    assert hd.auto_cap(runs) == 1900
    assert hd.auto_cap(runs[:2]) is None
    assert hd.auto_cap([dict(r, host_peak={"b1": 500}) if r["system"] == "plain" else r
                        for r in runs]) is None


# ------------------------------------------------------------------ CLI errors
@pytest.mark.parametrize("argv, needle", [
    (["--rates", "300mbps"], "--rates"),
    (["--rates", "1gbit,,unshaped"], "--rates: empty rate"),
    (["--rates", "1gbit,1gbit"], "--rates: '1gbit' given twice"),
    (["--repeats", "0"], "--repeats: expected a positive integer, got 0"),
    (["--steps", "x"], "--steps: expected a positive integer, got 'x'"),
    (["--table-gb", "-1"], "--table-gb: expected a positive number"),
    (["--zipf", "1"], "--zipf: expected an exponent > 1"),
    (["--bottom", "64,x"], "--bottom: expected comma-separated layer widths"),
    (["--top", "0"], "--top: expected positive layer widths"),
    (["--cap-memory", "lots"], "--cap-memory"),
    (["--kind-cores", "huge"], "unknown kind 'huge'"),
    (["--cap-rate", "fast"], "--cap-rate"),
    (["--batch", "2"], "--batch: the global batch is split over 3 ranks"),
    (["--report-only"], "--report-only needs --out"),
    (["--systems", "plain,hetre"], "--systems: unknown system 'hetre'"),
    (["--systems", "heter,heter"], "--systems: 'heter' given twice"),
    (["--systems", ""], "--systems: unknown system ''"),
    (["--optimizer", "rmsprop"], "--optimizer: invalid choice: 'rmsprop'"),
])
def test_bad_flags_name_the_flag(argv, needle, capsys):
    with pytest.raises(SystemExit):
        hd.parse_args(argv)
    assert needle in capsys.readouterr().err


def test_quick_mode_keeps_explicit_flags():
    a = hd.parse_args(["--quick", "--steps", "9"])
    assert a.steps == 9 and a.table_gb == hd.QUICK["table_gb"] and a.rates == ["1gbit"]
    assert hd.parse_args([]).table_gb == 1.0


# ------------------------------------------------------------------ the OOM path, for real
def _testbed_usable():
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "tc", "unshare")):
        return False
    try:
        from benchmarks import cgroups
        lay = cgroups.detect_layout()
        return "memory" in lay.parents and \
            subprocess.run(["ip", "netns", "list"], capture_output=True, timeout=30).returncode == 0
    except Exception:
        return False


@needs(_testbed_usable(), "needs root, ip netns, tc, unshare and a memory cgroup")
@pytest.mark.tf_stack
def test_a_cap_too_small_is_recorded_as_oom(tmp_path):
    """Plain Horovod on the testbed with b1 capped at 96 MiB (less than TF
    itself needs): the run comes back as a record with status 'oom' and b1's
    OOM kills counted, the harness goes on."""
    a = hd.parse_args(["--quick", "--table-gb", "0.001", "--steps", "2", "--warmup", "1",
                       "--run-timeout", "240"])
    cfg = hd.model_config(a)
    rec = hd.execute_run("plain", "1gbit", "cap", 0, a, cfg, tmp_path, 96 << 20)
    assert rec["status"] == "oom", rec
    assert rec["oom_kills"]["b1"] >= 1 and rec["hosts"]["b1"]["limits"]["memory"] == 96 << 20
    assert "samples_per_s" not in rec


def test_run_summary_keeps_each_roles_time_per_exchange():
    def rank(i, role, waits):
        return {"rank": i, "role": role, "host": "a1", "vm_hwm": 1, "rss_after_init": 1,
                "step_ends": [0.0, 1.0, 2.0, 3.0], "exchange_s_per_step": waits}
    ranks = [rank(0, "sparse", {"keys": 0.1, "rows": 0.3}), rank(1, "ps", {"keys": 0.2}),
             rank(2, "sparse", {"keys": 0.3, "rows": 0.1}), rank(3, "dense", {})]
    out = hd.summarize_run(ranks, [], steps=2, warmup=2, batch=8)
    assert out["s_per_step"] == 1.0
    got = out["exchange_s_per_step_by_role"]
    assert set(got) == {"sparse", "ps"}
    assert got["sparse"]["keys"] == pytest.approx(0.2) and got["sparse"]["rows"] == pytest.approx(0.2)
    assert got["ps"] == {"keys": 0.2}


def test_cpu_floor_is_the_busiest_hosts_cpu_over_its_cores():
    ranks = [{"host": "a1", "cpu_s_per_step": 0.08}, {"host": "a1", "cpu_s_per_step": 0.07},
             {"host": "a2", "cpu_s_per_step": 0.06}, {"host": "b1", "cpu_s_per_step": 0.4}]
    hosts = {"a1": {"limits": {"cpu": 0.5}}, "a2": {"limits": {"cpu": 0.5}},
             "b1": {"limits": {"cpu": 2.0}}}
    f = hd.cpu_floor(ranks, hosts)
    # a1: two ranks' 0.15 CPU-s on half a core; b1 uses more CPU but has four times the cores
    assert f["host"] == "a1" and f["s_per_step"] == pytest.approx(0.3)
    assert f["cpu_s_per_step_by_host"]["b1"] == pytest.approx(0.4)
    # no limit: the machine's cores
    f = hd.cpu_floor([{"host": "x", "cpu_s_per_step": 1.0}], {"x": {"limits": None}})
    assert f["s_per_step"] == pytest.approx(1.0 / os.cpu_count())
    assert hd.cpu_floor([{"host": "a1"}], hosts) is None


def test_the_table_shows_each_systems_cpu_floor(tmp_path):
    res = _results()
    for r in res["runs"]:
        if r["status"] == "ok":
            r["cpu_floor"] = {"s_per_step": 0.5 * r["s_per_step"] if r["system"] == "plain"
                              else 2.0, "host": "b1" if r["system"] == "plain" else "a1"}
    s = hd.summarize(res)
    assert s["300mbit"]["heter"]["cpu_floor_s_per_step"] == 2.0
    assert s["300mbit"]["heter"]["cpu_floor_hosts"] == ["a1"]
    hd.write_outputs(res, tmp_path)
    md = (tmp_path / "results.md").read_text()
    row = [ln for ln in md.splitlines() if ln.startswith("| 300mbit | 10.240")]
    # plain's median step 512/50 s, its floor half of that on b1; heter's floor 2 s on a1:
    # heter/plain at most 10.24 / 2.0
    assert row and "| 5.120 (b1) |" in row[0] and "| 2.000 (a1) | 5.12× |" in row[0]


# ------------------------------------------------------------------ one system, another optimizer
def test_systems_run_alone_or_alternating():
    assert hd.parse_args([]).systems == ["plain", "heter"]
    assert hd.parse_args(["--systems", "heter,plain"]).systems == ["plain", "heter"]
    assert [hd.run_order(["plain", "heter"], r) for r in range(3)] == \
        [["plain", "heter"], ["heter", "plain"], ["plain", "heter"]]
    assert [hd.run_order(hd.parse_args(["--systems", "heter"]).systems, r)
            for r in range(2)] == [["heter"], ["heter"]]


def test_main_runs_only_the_systems_asked_for(tmp_path, monkeypatch):
    """The harness's loop (every run's launch replaced by a record): with
    ``--systems heter`` only heter runs, every repeat, and the table says so;
    ``--optimizer`` reaches the workers' config."""
    from benchmarks import netns
    calls = []

    def fake_run(system, rate, scenario, repeat, a, cfg, workroot, b1_memory):
        calls.append((system, rate, scenario, repeat, cfg["optimizer"]))
        return dict(_run(system, rate, repeat, 100.0 if system == "plain" else 150.0),
                    host_peak={"b1": 1 << 30 if system == "plain" else 1 << 29})
    monkeypatch.setattr(hd, "execute_run", fake_run)
    monkeypatch.setattr(netns, "require_root", lambda: None)
    monkeypatch.setattr(netns, "install_signal_handlers", lambda: None)
    quick = ["--quick", "--table-gb", "0.001", "--out"]
    assert hd.main(quick + [str(tmp_path / "one"), "--systems", "heter", "--repeats", "2",
                            "--no-cap", "--optimizer", "adam"]) == 0
    assert calls == [("heter", "1gbit", "throughput", 0, "adam"),
                     ("heter", "1gbit", "throughput", 1, "adam")]
    md = (tmp_path / "one" / "results.md").read_text()
    assert "Adam (learning rate 0.001); systems run: heter." in md
    assert "| 1gbit | – | 150.0 | – |" in md
    calls.clear()
    assert hd.main(quick + [str(tmp_path / "both"), "--repeats", "2"]) == 0
    assert calls == [("plain", "1gbit", "throughput", 0, "adagrad"),
                     ("heter", "1gbit", "throughput", 0, "adagrad"),
                     ("heter", "1gbit", "throughput", 1, "adagrad"),
                     ("plain", "1gbit", "throughput", 1, "adagrad"),
                     ("plain", "unshaped", "cap", 0, "adagrad"),
                     ("heter", "unshaped", "cap", 0, "adagrad")]
    md = (tmp_path / "both" / "results.md").read_text()
    assert "Adagrad (learning rate 0.05)." in md and "systems run" not in md
    assert "| 1gbit | 100.0 | 150.0 | 1.50× (1.50–1.50) |" in md
    calls.clear()             # the memory-cap scenario too runs only the systems asked for
    assert hd.main(quick + [str(tmp_path / "cap"), "--systems", "heter",
                            "--cap-memory", "1GiB"]) == 0
    assert calls == [("heter", "1gbit", "throughput", 0, "adagrad"),
                     ("heter", "unshaped", "cap", 0, "adagrad")]


@pytest.mark.tf_stack
def test_the_optimizer_both_systems_train_with():
    import tensorflow as tf
    for flag, cls, lr in (("adagrad", tf.keras.optimizers.Adagrad, 0.05),
                          ("adam", tf.keras.optimizers.Adam, 0.001),
                          ("sgd", tf.keras.optimizers.SGD, 0.05)):
        cfg = hd.model_config(hd.parse_args(["--optimizer", flag]))
        opt = hd.keras_optimizer(cfg)
        assert type(opt) is cls and float(opt.learning_rate.numpy()) == pytest.approx(lr)
    # a config recorded before the flag trained with Adagrad
    assert type(hd.keras_optimizer({})) is tf.keras.optimizers.Adagrad
    assert hd.parse_args([]).optimizer == "adagrad"


def test_malloc_tuning_flag_and_which_ranks_were_tuned(tmp_path, capsys):
    """--malloc-tuning picks HOROVOD_PRIO_MALLOC_TUNING for both systems'
    ranks; each rank's record says whether it was tuned and results.md names
    the tuned ranks."""
    assert hd.parse_args([]).malloc_tuning == "default"
    assert hd.MALLOC_TUNING == {"default": None, "off": "0", "all": "1"}
    with pytest.raises(SystemExit):
        hd.parse_args(["--malloc-tuning", "maybe"])
    assert "--malloc-tuning: invalid choice: 'maybe'" in capsys.readouterr().err

    def rank(i, role, tuned):
        return {"rank": i, "role": role, "host": "a1", "vm_hwm": 1, "rss_after_init": 1,
                "step_ends": [0.0, 1.0, 2.0, 3.0], "cpu_s_per_step": 0.1, "malloc_tuned": tuned}
    out = hd.summarize_run([rank(0, "sparse", True), rank(1, "ps", True)], [], 2, 2, 8)
    assert [r["malloc_tuned"] for r in out["ranks"]] == [True, True]
    res = _results()
    res["meta"]["malloc_tuning"] = "default"
    for r in res["runs"]:
        if r["status"] == "ok":
            r["ranks"] = ([{"role": "replica", "malloc_tuned": False}] if r["system"] == "plain"
                          else [{"role": "ps", "malloc_tuned": True},
                                {"role": "dense", "malloc_tuned": r["rate"] == "1gbit"}])
    hd.write_outputs(res, tmp_path)
    md = (tmp_path / "results.md").read_text()
    assert "glibc malloc tuning (`--malloc-tuning`): default (tuned: heter ps; in some runs " \
           "only: heter dense)." in md

