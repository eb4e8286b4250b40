"""``horovod-prio arbiter`` as a real process: serve, --stats, kill -9, restart."""
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from horovod_prio.arbiter.client import ArbiterClient
from waiting import wait_until

pytestmark = pytest.mark.timeout(40)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = "cli-test-secret-of-some-length"


def _env(**extra):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("HOROVOD_PRIO_"):
            del env[k]
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_cli(*args, env=None, timeout=20):
    return subprocess.run([sys.executable, "-m", "horovod_prio.cli", "arbiter", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else _env())


def start_arbiter(*args, env=None):
    p = subprocess.Popen([sys.executable, "-m", "horovod_prio.cli", "arbiter", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env if env is not None else _env(HOROVOD_PRIO_ARBITER_SECRET=SECRET))
    line = p.stdout.readline()
    m = re.search(r"listening on ([\d.]+):(\d+)", line)
    if not m:
        p.kill()
        raise AssertionError("arbiter did not start: %r %r" % (line, p.stderr.read()))
    return p, (m.group(1), int(m.group(2)))


class Grants:
    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, chunk):
        with self.lock:
            self.calls.append(chunk)


def test_cli_errors_are_clear(tmp_path):
    r = run_cli("--bind", "127.0.0.1:0")
    assert r.returncode == 2 and "HOROVOD_PRIO_ARBITER_SECRET" in r.stderr
    r = run_cli("--bind", "127.0.0.1:0", "--secret-file", str(tmp_path / "missing"))
    assert r.returncode == 2 and "--secret-file" in r.stderr
    r = run_cli("--bind", "nonsense", env=_env(HOROVOD_PRIO_ARBITER_SECRET="x"))
    assert r.returncode == 2 and "host:port" in r.stderr
    r = run_cli("--bind", "127.0.0.1:0", "--credit-bytes", "lots", env=_env(HOROVOD_PRIO_ARBITER_SECRET="x"))
    assert r.returncode == 2 and "credit-bytes" in r.stderr
    r = run_cli("--bind", "127.0.0.1:0", "--lease-seconds", "0", env=_env(HOROVOD_PRIO_ARBITER_SECRET="x"))
    assert r.returncode == 2 and "lease-seconds" in r.stderr
    r = run_cli("--bind", "127.0.0.1:0", "--order", "fifo", env=_env(HOROVOD_PRIO_ARBITER_SECRET="x"))
    assert r.returncode == 2 and "--order" in r.stderr and "burst" in r.stderr
    r = run_cli()
    assert r.returncode == 2


def test_cli_reads_sizes_counts_and_seconds_with_the_projects_parsers(capsys):
    """Same rules as the HOROVOD_PRIO_* variables (horovod_prio.method.units)."""
    from horovod_prio.arbiter.cli import build_parser
    from horovod_prio.method import units
    p = build_parser()
    a = p.parse_args(["--bind", "h:1", "--credit-bytes", "1MB", "--link-credit", "eth1=1.5KiB",
                      "--link-credit", "eth2=2M", "--lease-seconds", "0.25", "--starvation-bound", "0",
                      "--handshake-timeout", "1e-1", "--max-handshakes", "8",
                      "--class-reserve", "0.25"])
    assert a.credit_bytes == units.parse_bytes("1MB") == 1000000
    assert dict(a.link_credit) == {"eth1": 1536, "eth2": 2 << 20}
    assert a.lease_seconds == 0.25 and a.starvation_bound == 0 and a.handshake_timeout == 0.1
    assert a.max_handshakes == 8 and a.class_reserve == 0.25
    assert p.parse_args(["--bind", "h:1"]).class_reserve == 0.875     # the measured default
    for argv, rule in ((["--credit-bytes", "1.0001KiB"], units.bytes_rule(1)),
                       (["--credit-bytes", "0"], units.bytes_rule(1)),
                       (["--link-credit", "eth1=lots"], units.bytes_rule(1)),
                       (["--starvation-bound", "2.5"], "an integer >= 0"),
                       (["--lease-seconds", "nan"], "a finite number > 0 seconds"),
                       (["--max-handshakes", "0"], "an integer >= 1"),
                       (["--class-reserve", "1"], "a share of the credit in [0, 1)"),
                       (["--class-reserve", "half"], "a share of the credit in [0, 1)")):
        with pytest.raises(SystemExit):
            p.parse_args(["--bind", "h:1"] + argv)
        err = capsys.readouterr().err
        assert argv[0] in err and rule in err, err


def test_cli_serves_reports_stats_and_survives_kill_restart(tmp_path, caplog):
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    p, addr = start_arbiter("--bind", "127.0.0.1:0", "--secret-file", str(secret_file),
                            "--credit-bytes", "1KiB", "--link-credit", "eth1=2KiB",
                            "--lease-seconds", "5", "--starvation-bound", "4", "--order", "burst",
                            "--class-reserve", "0.25",
                            "--log-level", "DEBUG", env=_env())
    p2 = None
    g = Grants()
    c = ArbiterClient(addr, "eth1", "job-a", SECRET, g, timeout=1.0,    # a kill resets the connection
                      backoff_initial=0.05, backoff_max=0.2)
    try:
        assert wait_until(lambda: c.connected)
        c.request(1, 3, 100)
        assert wait_until(lambda: g.calls == [1])

        r = run_cli("--stats", "%s:%d" % addr, "--secret-file", str(secret_file), env=_env())
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        link = st["links"]["eth1"]
        assert link["grants"] == 1 and link["connected_jobs"] == 1 and link["credit_bytes"] == 2048
        assert st["server"]["credit_bytes"] == 1024 and st["server"]["starvation_bound"] == 4
        assert st["server"]["order"] == "burst" and st["server"]["class_reserve"] == 0.25
        assert link["lower_class_cap_bytes"] == 2048 - 512
        r = run_cli("--stats", "%s:%d" % addr, env=_env(HOROVOD_PRIO_ARBITER_SECRET="wrong"))
        assert r.returncode == 1, r.stderr
        assert "stats from %s:%d failed: authentication failed" % addr in r.stderr \
            and "wrong secret" in r.stderr, r.stderr

        with caplog.at_level(logging.WARNING, logger="horovod_prio.arbiter"):
            p.send_signal(signal.SIGKILL)                # killed mid-run
            p.wait(10)
            c.request(2, 3, 100)
            assert wait_until(lambda: 2 in g.calls)
            assert not c.connected
            p2, addr2 = start_arbiter("--bind", "%s:%d" % addr, "--log-level", "DEBUG")
            assert addr2 == addr
            assert wait_until(lambda: c.connected)
            c.request(3, 3, 100, "c2")
            assert wait_until(lambda: 3 in g.calls)
        assert g.calls == [1, 2, 3]
        k = c.counters
        assert k["arbiter_grants"] == 2 and k["fallback_grants"] == 1 and k["reconnects"] == 1
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1

        r = run_cli("--stats", "%s:%d" % addr, env=_env(HOROVOD_PRIO_ARBITER_SECRET=SECRET))
        assert json.loads(r.stdout)["links"]["eth1"]["grants"] == 1
    finally:
        c.close()
        for proc in (p, p2):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(10) == 0
        err = p2.stderr.read() if p2 is not None else ""
        if p2 is not None:
            # debug log names the job of every grant
            assert "grant link=eth1 job=job-a chunk=c2" in err


JOB_SCRIPT = r"""
import sys, threading, time
from horovod_prio.arbiter.client import ArbiterClient
got = threading.Event()
c = ArbiterClient(sys.argv[1], "eth0", "crashy", sys.argv[2], lambda ch: got.set(), timeout=1.0)
c.request(1, 100, 1000, "big")
got.wait(10)
print("granted" if c.connected else "local", flush=True)
time.sleep(60)
"""


def test_killed_job_frees_the_link():
    """kill -9 of a job holding the link: the arbiter releases its grant at once."""
    from horovod_prio.arbiter.server import ArbiterServer
    srv = ArbiterServer("127.0.0.1", 0, SECRET, credit_bytes=1000, lease_seconds=30)
    host, port = srv.start()
    job = subprocess.Popen([sys.executable, "-c", JOB_SCRIPT, "%s:%d" % (host, port), SECRET],
                           stdout=subprocess.PIPE, text=True, env=_env())
    g = Grants()
    c = ArbiterClient((host, port), "eth0", "survivor", SECRET, g, timeout=1.0)
    try:
        assert job.stdout.readline().strip() == "granted"
        assert wait_until(lambda: c.connected)
        c.request(7, 1, 10)
        time.sleep(0.2)
        assert g.calls == []                         # the link is held by the other job
        job.send_signal(signal.SIGKILL)
        job.wait(10)
        assert wait_until(lambda: g.calls == [7], timeout=5)   # long before the 30 s lease
        st = srv.call(lambda: srv.stats()["links"]["eth0"])
        assert st["dropped"] == 1 and st["expired_leases"] == 0 and st["connected_jobs"] == 1
        assert c.counters["arbiter_grants"] == 1
    finally:
        c.close()
        if job.poll() is None:
            job.kill()
        srv.stop()
