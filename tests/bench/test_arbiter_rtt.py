"""benchmarks.arbiter_rtt, its per-stage probes (rtt_probe), the native floor
(rtt_native.c) and the interleaving driver (arbiter_rtt_matrix): behaviour,
not timing. The process tests run a few dozen round trips on loopback."""
import json
import shutil
import socket
import threading
import time

import pytest

from benchmarks import arbiter_rtt as ar
from benchmarks import arbiter_rtt_matrix as am
from benchmarks import rtt_probe as rp
from stack_required import needs, stack_missing

needs_gcc = needs(shutil.which("gcc") is not None, "gcc is not installed")


# ---------------------------------------------------------------- arguments

def test_baseline_and_grpc_are_server_aliases():
    assert ar.parse_args(["--baseline"]).server == "echo"
    assert ar.parse_args(["--grpc"]).server == "grpc"
    a = ar.parse_args([])
    assert (a.server, a.client, a.profile, a.tree) == ("python", "python", False, None)


@pytest.mark.parametrize("argv", [
    ["--grpc", "--baseline"],
    ["--baseline", "--server", "native"],
    ["--server", "grpc", "--client", "native"],
    ["--profile", "--client", "native"],
    ["--profile", "--server", "echo"],
    ["--tree", "/nonexistent-dir"],
    ["--jobs", "0"],
    ["--ab-tree", "/nonexistent-dir"],
    ["--ab-tree", ".", "--client", "native"],
    ["--ab-tree", ".", "--profile"],
    ["--ab-tree", ".", "--jobs", "1"],
    ["--ab-tree", ".", "--server", "echo"],
    ["--arbiter-args", "--priority realtime", "--server", "native"],
    ["--arbiter-args", "--priority realtime", "--profile"],
    ["--io-priority", "fifo"],
    ["--io-priority", "nice=1", "--client", "native"],
])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        ar.parse_args(argv)
    assert e.value.code == 2


# ---------------------------------------------------------------- stage breakdown

def _sample(rtt_scale=1, server=True):
    # a chain with the stages 1..11 us apart (x rtt_scale), sends overlapping
    pts = ["t0", "c_sealed", "s_wake", "s_start", "s_read", "s_open", "s_core", "s_sealed",
           "c_wake", "c_read", "c_open", "c_deliver"]
    s, t = {}, 1_000_000
    for i, p in enumerate(pts):
        t += i * 1000 * rtt_scale
        s[p] = t
    s["c_sent"] = s["c_sealed"] + 5000
    s["s_sent"] = s["s_sealed"] + 7000
    if not server:
        for p in pts[2:8] + ["s_sent"]:
            del s[p]
    return s


def test_breakdown_stages_add_up_to_the_round_trip():
    samples = [_sample() for _ in range(99)] + [_sample(rtt_scale=10)]
    b = rp.breakdown(samples)
    assert b["round_trips"] == 100
    assert [r["stage"] for r in b["stages"]] == [name for name, _, _ in rp.STAGES]
    rtt = samples[0]["c_deliver"] - samples[0]["t0"]
    assert sum(r["p50_us"] for r in b["stages"]) == pytest.approx(rtt / 1000.0)
    # the slowest 1 % is the one scaled sample: its stages are 10x
    assert b["tail_round_trips"] == 1
    assert b["stages"][1]["tail_mean_us"] == pytest.approx(10 * b["stages"][1]["p50_us"])
    assert [r["stage"] for r in b["syscalls"]] == [name for name, _, _ in rp.SYSCALLS]
    assert b["syscalls"][0]["p50_us"] == 5.0 and b["syscalls"][1]["p50_us"] == 7.0


def test_breakdown_without_server_points_merges_the_server_part():
    b = rp.breakdown([_sample(server=False) for _ in range(10)])
    names = [r["stage"] for r in b["stages"]]
    assert names[0] == rp.STAGES[0][0] and names[-1] == rp.STAGES[-1][0]
    assert any("c_sealed" in n and "c_wake" in n for n in names)
    assert not any(n.startswith("server") for n in names)
    s = _sample()
    assert sum(r["p50_us"] for r in b["stages"]) == pytest.approx((s["c_deliver"] - s["t0"]) / 1000.0)


def test_breakdown_skips_incomplete_samples():
    assert rp.breakdown([{"t0": 1}]) == {}
    b = rp.breakdown([_sample(), {"t0": 5}])
    assert b["round_trips"] == 1


# ---------------------------------------------------------------- load

def test_host_load_foreign_cpus(monkeypatch):
    monkeypatch.setattr(ar.os, "sysconf", lambda name: 100)
    monkeypatch.setattr(ar.os, "cpu_count", lambda: 2)
    # 2 s of 2 CPUs = 400 jiffies; 300 busy, 20 steal; own processes 1.0 CPU-s
    h = ar.host_load((0, 0, 0), (300, 20, 400), 1.0)
    assert h == {"busy": 0.75, "steal": 0.05, "foreign_cpus": 1.0, "seconds": 2.0}
    assert ar.host_load(None, (1, 1, 1), 0) is None
    assert ar.host_load((0, 0, 0), (300, 20, 400), None)["foreign_cpus"] is None


# ---------------------------------------------------------------- matrix driver

def test_matrix_plan_rotates_and_interleaves():
    runs = am.plan(["a", "b", "c"], 3)
    assert [k for k, _ in runs] == [0] * 3 + [1] * 3 + [2] * 3
    assert [[c for k, c in runs if k == r] for r in range(3)] == \
        [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]


def test_matrix_parse_config():
    assert am.parse_config("native/python", {}) == (
        "native/python", ["--server", "native", "--client", "python"])
    assert am.parse_config("python/python@old", {"old": "/x"})[1][-2:] == ["--tree", "/x"]
    for bad in ("nope/python", "python/nope", "python/python@missing"):
        with pytest.raises(ValueError):
            am.parse_config(bad, {})


def test_matrix_parse_paired_config():
    trees = {"a": "/ta", "b": "/tb"}
    assert am.parse_config("python/python@a~b", trees)[1][-4:] == ["--tree", "/ta", "--ab-tree", "/tb"]
    argv = am.parse_config("native/python@~b", trees)[1]
    assert "--tree" not in argv and argv[-2:] == ["--ab-tree", "/tb"]
    for bad in ("python/python@a~", "python/python@a~zz"):
        with pytest.raises(ValueError):
            am.parse_config(bad, trees)


def test_matrix_compare_pairs_both_orders():
    def half(tree, p50, cpu):
        return {"tree": tree, "rtt_us": {"p50": p50, "p90": 2 * p50, "p99": 3 * p50},
                "client_cpu_us_per_grant": cpu}
    runs = [{"errors": [], "ab": {"a": half("/ta", 100, 50), "b": half("/tb", 90, 45)}},
            {"errors": [], "ab": {"a": half("/tb", 80, 40), "b": half("/ta", 100, 50)}},
            {"errors": [], "ab": {"a": half("/ta", 100, 50), "b": half("/tb", 110, 55)}},
            {"errors": ["x"], "ab": {"a": half("/ta", 1, 1), "b": half("/tb", 1, 1)}},
            {"errors": [], "rtt_us": {}}]
    out = am.compare_pairs(runs, {"a": "/ta", "b": "/tb"})
    assert out["versions"]["a"]["runs"] == 3 and out["versions"]["b"]["p50"] == 90
    (d,) = out["differences"]
    assert (d["first"], d["second"], d["runs"]) == ("a", "b", 3)
    assert d["median_p50_diff"] == -10 and d["median_p99_diff"] == -30
    assert d["median_client_cpu_diff"] == -5
    assert d["second_lower_p50"] == 2


def test_matrix_summary_medians_ignore_failed_runs():
    def run(cfg, p99, err=()):
        return {"config": cfg, "errors": list(err), "rtt_us": {"p50": p99 / 2, "p90": p99, "p99": p99},
                "loadavg_1m_before": 1.0, "host": {"foreign_cpus": 0.1}}
    rows = am.summarize([run("a", 100), run("a", 300), run("a", 200), run("a", 1, ["x"]),
                         run("b", 10), run("b", 20)])
    a, b = rows
    assert (a["config"], a["runs"], a["failed"], a["p99"], a["p99_min"], a["p99_max"]) == \
        ("a", 4, 1, 200, 100, 300)
    assert b["p99"] == 15.0


def test_wait_quiet_waits_for_an_idle_second(monkeypatch):
    # busy 90 %, then 10 %: returns after the second probe
    snaps = iter([(0, 0, 0), (90, 0, 100), (90, 0, 100), (100, 0, 200)])
    monkeypatch.setattr(am, "host_cpu", lambda: next(snaps))
    busy, waited = am.wait_quiet(0.2, 60, probe=1.0, sleep=lambda s: None)
    assert busy == 0.1 and waited == 3.0
    snaps2 = iter([(0, 0, 0), (90, 0, 100)] * 10)
    monkeypatch.setattr(am, "host_cpu", lambda: next(snaps2))
    busy, waited = am.wait_quiet(0.2, 1.0, probe=1.0, sleep=lambda s: None)
    assert busy == 0.9 and waited == 1.0


# ---------------------------------------------------------------- processes

def _run(capsys, argv):
    rc = ar.main(["--json", "--samples", "30", "--warmup", "5", "--interval", "0.0005"] + argv)
    out = capsys.readouterr().out.strip().splitlines()[-1]
    return rc, json.loads(out)


def test_profile_run_joins_client_and_server_points(capsys):
    rc, res = _run(capsys, ["--jobs", "2", "--profile"])
    assert rc == 0 and res["errors"] == [] and res["samples"] == 60
    prof = res["profile"]
    assert prof["round_trips"] == 60
    assert [r["stage"] for r in prof["stages"]] == [name for name, _, _ in rp.STAGES]
    assert all(r["p50_us"] >= 0 for r in prof["stages"][2:7])     # server stages, in order
    assert res["host"] is not None and res["loadavg_1m_before"] is not None


def test_ab_run_reports_each_half(capsys):
    """--ab-tree: odd jobs run the other checkout's code against their own
    arbiter; both halves are reported (same code here, so both must work)."""
    rc, res = _run(capsys, ["--jobs", "4", "--ab-tree", ar.ROOT])
    assert rc == 0 and res["errors"] == [] and res["samples"] == 120
    a, b = res["ab"]["a"], res["ab"]["b"]
    assert (a["jobs"], b["jobs"], a["samples"], b["samples"]) == (2, 2, 60, 60)
    assert b["tree"] == ar.ROOT and a["tree"] is None
    assert a["server_cpu_us_per_grant"] is not None and b["server_cpu_us_per_grant"] is not None
    assert res["arbiter_grants"] == 2 * (30 + 5)          # the A arbiter saw only the A jobs


@pytest.mark.scheduler_lib
@pytest.mark.parametrize("client", ["sched-native", "sched-python"])
def test_scheduler_path_times_request_to_release_through_the_arbiter(capsys, client):
    """--client sched-*: every round trip is a chunk the scheduler requested and
    the arbiter's grant released (none granted locally), read from the trace,
    with the arbiter client the name says."""
    rc, res = _run(capsys, ["--jobs", "2", "--client", client])
    assert rc == 0 and res["errors"] == [] and res["samples"] == 60
    assert res["fallback_grants"] == 0 and res["arbiter_grants"] == 70
    assert res["arbiter_client"] == [client.split("-")[1]]
    assert all(0 < v for v in res["rtt_us"].values())


@pytest.mark.parametrize("argv", [["--client", "sched-native", "--server", "echo"],
                                  ["--client", "sched-python", "--profile"],
                                  ["--client", "sched-native", "--ab-tree", "."]])
def test_scheduler_path_needs_an_arbiter_and_no_probe(argv):
    with pytest.raises(SystemExit) as e:
        ar.parse_args(argv)
    assert e.value.code == 2


@needs_gcc
def test_native_build_reports_its_hmac():
    exe, kind = ar.build_native()
    assert kind in ("openssl", "none")
    assert ar.build_native(exe=exe) == (exe, kind)


@needs_gcc
@pytest.mark.parametrize("server,client", [("native", "native"), ("native", "native-io-thread"),
                                           ("native", "python"), ("python", "native"),
                                           ("native-echo", "native"), ("native-echo", "python")])
def test_native_combinations_round_trip(capsys, server, client):
    if server == "native" or (server == "python" and client != "python"):
        if ar.build_native()[1] != "openssl":
            stack_missing("rtt_native built without OpenSSL (libssl-dev)")
    rc, res = _run(capsys, ["--jobs", "2", "--server", server, "--client", client])
    assert rc == 0, res["errors"]
    assert res["samples"] == 60 and res["fallback_grants"] == 0
    if server == "native":
        assert res["arbiter_grants"] == 70 and res["native_hmac"] == "openssl"


@needs_gcc
def test_native_arbiter_checks_the_secret_and_every_mac():
    """The native server speaks the real protocol: the Python client registers
    with the right secret, falls back with a wrong one, and a frame with a bad
    MAC closes that connection."""
    if ar.build_native()[1] != "openssl":
        stack_missing("rtt_native built without OpenSSL (libssl-dev)")
    from horovod_prio.arbiter import protocol as P
    from horovod_prio.arbiter.client import ArbiterClient
    args = ar.parse_args(["--server", "native"])
    srv = ar._Server(args)
    try:
        got = []
        ok = ArbiterClient(srv.addr, "link0", "good", ar.SECRET, got.append, timeout=0.5)
        bad = ArbiterClient(srv.addr, "link0", "bad", "wrong-secret-0123456789", got.append,
                            timeout=0.5)
        deadline = time.monotonic() + 5
        while not ok.connected and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ok.connected
        ok.request(7, 1, 100)
        while 7 not in got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ok.counters["arbiter_grants"] == 1
        while bad.counters["outages"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not bad.connected and bad.counters["outages"] == 1
        ok.close()
        bad.close()

        # by hand: authenticate, then send a REQUEST with a flipped MAC bit
        host, port = srv.addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            hs = P.ClientHandshake(P.load_secret(ar.SECRET))
            s.sendall(hs.hello())
            fr = P.FrameReader()
            bodies = []

            def frames(n):
                while len(bodies) < n:
                    data = s.recv(65536)
                    if not data:
                        return False
                    bodies.extend(fr.feed(data))
                return True
            assert frames(1)
            s.sendall(hs.on_challenge(bodies[0]) + hs.session.seal(P.enc_register("x", "link0")))
            assert frames(3)
            hs.on_verdict(bodies[1])
            assert hs.session.open(bodies[2])[0] == P.T_REGISTERED
            good = hs.session.seal(P.enc_request(1, 0, 10, "c"))
            forged = good[:-1] + bytes([good[-1] ^ 1])
            s.sendall(forged)
            assert not frames(4)                          # closed, no GRANT
    finally:
        _, _, _ = srv.stop()


def test_echo_job_frames_its_message():
    """The Python echo job sends one length-prefixed frame (so the native echo,
    which echoes frames, answers it)."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    seen = []

    def serve():
        c, _ = ls.accept()
        buf = b""
        while True:
            d = c.recv(65536)
            if not d:
                break
            buf += d
            seen.append(d)
            c.sendall(d)
        c.close()
    th = threading.Thread(target=serve, daemon=True)
    th.start()

    class Q:
        def put(self, item):
            self.item = item
    q, ev = Q(), threading.Event()
    ev.set()
    ar._echo_job(0, ls.getsockname()[1], 3, 0, 0, q, ev)
    th.join(5)
    ls.close()
    assert q.item[1] is not None and len(q.item[1]) == 3
    data = b"".join(seen)
    assert len(data) == 3 * 52
    assert all(data[i:i + 4] == (48).to_bytes(4, "big") for i in range(0, len(data), 52))



# ---------------------------------------------------------------- the client's turn (client.py)

def test_client_delivers_a_grant_in_the_turn_that_read_it():
    """The round trip ends at on_grant: the I/O thread hands a GRANT to
    on_grant right after reading it, not after another pass over its timers."""
    from horovod_prio.arbiter.client import ArbiterClient
    from horovod_prio.arbiter.server import ArbiterServer
    secret = "turn-test-secret-0123456789"
    srv = ArbiterServer(secret=secret, credit_bytes=1 << 30)
    addr = srv.start()
    log, got = [], threading.Event()

    def on_grant(key):
        log.append(("on_grant", key))
        got.set()
    cl = ArbiterClient("%s:%d" % addr, "link0", "j", secret, on_grant, timeout=0.5)
    try:
        deadline = time.monotonic() + 5
        while not cl.connected and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cl.connected
        orig_timers, orig_frame = cl._timers, cl._on_frame

        def timers(now):
            log.append(("timers",))
            return orig_timers(now)

        def on_frame(body, now):
            n = len(cl._due)
            orig_frame(body, now)
            if len(cl._due) > n:
                log.append(("granted", cl._due[-1].key))
        cl._timers, cl._on_frame = timers, on_frame
        for k in range(20):
            got.clear()
            cl.request(k, 1, 100)
            assert got.wait(5)
            cl.complete(k)
        assert [e[1] for e in log if e[0] == "on_grant"] == list(range(20))
        for i, e in enumerate(log):
            if e[0] == "on_grant":
                before = [x for x in log[:i] if x[0] in ("granted", "timers")]
                assert before[-1] == ("granted", e[1]), log[max(0, i - 4):i + 1]
    finally:
        cl.close()
        srv.stop()


def test_arbiter_args_reach_the_python_arbiter(capsys):
    # a value the arbiter's CLI refuses: the arbiter exits instead of listening
    with pytest.raises(SystemExit, match="server did not start"):
        _run(capsys, ["--jobs", "1", "--arbiter-args", "--priority nice=99"])
    rc, res = _run(capsys, ["--jobs", "1", "--arbiter-args", "--priority nice=1"])
    assert rc == 0 and res["samples"] == 30 and res["arbiter_args"] == "--priority nice=1"


def test_io_priority_reaches_the_jobs_clients(capsys, monkeypatch):
    monkeypatch.delenv(ar.IO_PRIORITY_ENV, raising=False)
    nice = "nice=%d" % min(ar.os.getpriority(ar.os.PRIO_PROCESS, 0) + 1, 19)
    for client in ("python", "sched-native"):
        rc, res = _run(capsys, ["--jobs", "2", "--client", client, "--io-priority", nice])
        assert rc == 0 and res["samples"] == 60, res["errors"]
        assert res["io_priority"] == nice and res["jobs_io_priority"] == [nice], res
        # main() leaves the process's environment as it found it: a later optimizer in this
        # process must not take the setting (it is one per process, runtime.setup)
        assert ar.IO_PRIORITY_ENV not in ar.os.environ
    rc, res = _run(capsys, ["--jobs", "1"])
    assert res["jobs_io_priority"] == [None]
