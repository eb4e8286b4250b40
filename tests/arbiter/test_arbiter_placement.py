"""``horovod-prio arbiter --cpu/--priority``: what is parsed, what is applied
to the serving threads, and the errors when the system refuses. No timing."""
import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys

import pytest

from horovod_prio.arbiter import cli
from stack_required import needs

from test_arbiter_cli import SECRET, _env, start_arbiter

pytestmark = pytest.mark.timeout(40)

LINUX = sys.platform.startswith("linux") and os.path.isdir("/proc/self/task")


# ---------------------------------------------------------------- parsing

@pytest.mark.parametrize("text,cpus", [
    ("3", {3}), ("0,2", {0, 2}), ("0-3", {0, 1, 2, 3}), ("1, 4-5", {1, 4, 5}), ("2-2", {2}),
])
def test_cpu_lists(text, cpus):
    assert cli.parse_cpus(text) == cpus


@pytest.mark.parametrize("text", ["", "x", "1,", "-1", "3-1", "1.5", "0-x"])
def test_bad_cpu_lists_name_the_rule(text):
    with pytest.raises(argparse.ArgumentTypeError, match="CPU numbers"):
        cli.parse_cpus(text)


@pytest.mark.parametrize("text,prio", [
    ("realtime", ("realtime", cli.REALTIME_DEFAULT)), ("realtime=1", ("realtime", 1)),
    ("realtime=99", ("realtime", 99)), ("nice=-20", ("nice", -20)), ("nice=19", ("nice", 19)),
    ("nice=0", ("nice", 0)),
])
def test_priorities(text, prio):
    assert cli.parse_priority(text) == prio


@pytest.mark.parametrize("text", ["", "rt", "realtime=0", "realtime=100", "realtime=x", "nice",
                                  "nice=", "nice=20", "nice=-21", "nice=1.5", "fifo=10"])
def test_bad_priorities_name_the_rule(text):
    with pytest.raises(argparse.ArgumentTypeError, match=r"realtime=N \(N in 1\.\.99\)"):
        cli.parse_priority(text)


@pytest.mark.parametrize("argv,option", [
    (["--cpu", "a"], "--cpu"), (["--priority", "nice=99"], "--priority"),
])
def test_bad_values_exit_2_naming_the_option(argv, option, capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["--bind", "127.0.0.1:0"] + argv)
    assert e.value.code == 2
    assert "argument %s:" % option in capsys.readouterr().err


# ---------------------------------------------------------------- applying (system calls faked)

class FakeOs:
    """Records the scheduling calls ``apply_placement`` makes; ``refuse`` maps a
    call's name to the exception it raises."""

    def __init__(self, monkeypatch, allowed=(0, 1), refuse=None):
        self.calls, self.refuse = [], refuse or {}
        for name in ("sched_getaffinity", "sched_setaffinity", "sched_setscheduler",
                     "setpriority"):
            monkeypatch.setattr(cli.os, name, self._fake(name, allowed), raising=False)

    def _fake(self, name, allowed):
        def call(*args):
            if name == "sched_getaffinity":
                return set(allowed)
            if name in self.refuse:
                raise self.refuse[name]
            self.calls.append((name,) + args)
        return call


def test_apply_pins_and_schedules_the_calling_thread(monkeypatch):
    f = FakeOs(monkeypatch)
    said = cli.apply_placement(frozenset({1}), ("realtime", 20))
    assert f.calls[0] == ("sched_setaffinity", 0, frozenset({1}))
    name, pid, policy, param = f.calls[1]
    assert (name, pid, policy, param.sched_priority) == ("sched_setscheduler", 0, os.SCHED_FIFO, 20)
    assert said == "pinned to CPU 1; scheduled SCHED_FIFO at priority 20"
    f.calls.clear()
    assert cli.apply_placement(None, ("nice", -5)) == "at nice -5"
    assert f.calls == [("setpriority", os.PRIO_PROCESS, 0, -5)]
    f.calls.clear()
    assert cli.apply_placement(None, None) == "" and f.calls == []


def test_a_cpu_outside_the_allowed_set_is_named(monkeypatch):
    f = FakeOs(monkeypatch, allowed=(0, 1))
    with pytest.raises(cli.PlacementError, match=r"--cpu 1,2,5: CPU 2,5 not available to this "
                                                 r"process \(allowed: 0,1\)"):
        cli.apply_placement(frozenset({1, 2, 5}))
    assert f.calls == []


@pytest.mark.parametrize("refuse,cpus,prio,message", [
    ({"sched_setscheduler": PermissionError(1, "Operation not permitted")}, None,
     ("realtime", 10), r"--priority realtime=10: not permitted: SCHED_FIFO needs root, "
                       r"CAP_SYS_NICE or an RLIMIT_RTPRIO of at least 10"),
    ({"sched_setscheduler": OSError(22, "Invalid argument")}, None, ("realtime", 10),
     r"--priority realtime=10: cannot set SCHED_FIFO: Invalid argument"),
    ({"setpriority": PermissionError(13, "Permission denied")}, None, ("nice", -5),
     r"--priority nice=-5: not permitted: a nice value below the current one needs root, "
     r"CAP_SYS_NICE or RLIMIT_NICE"),
    ({"sched_setaffinity": OSError(22, "Invalid argument")}, frozenset({0}), None,
     r"--cpu 0: cannot pin the arbiter: Invalid argument"),
])
def test_refusals_name_the_option_and_the_permission(monkeypatch, refuse, cpus, prio, message):
    FakeOs(monkeypatch, refuse=refuse)
    with pytest.raises(cli.PlacementError, match=message):
        cli.apply_placement(cpus, prio)


# ---------------------------------------------------------------- a real arbiter process

def _threads(pid):
    """Per thread of ``pid``: (allowed CPUs, scheduling policy, nice)."""
    out = []
    for tid in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
            cpus = re.search(r"^Cpus_allowed_list:\s*(\S+)", f.read(), re.M).group(1)
        with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
            fields = f.read().rpartition(")")[2].split()
        out.append((cpus, int(fields[38]), int(fields[16])))     # policy, nice
    return out


@needs(LINUX and hasattr(os, "sched_getaffinity"), "needs Linux (/proc, sched_setaffinity)")
def test_every_serving_thread_is_pinned_and_niced():
    cpu = max(os.sched_getaffinity(0))
    nice = min(os.getpriority(os.PRIO_PROCESS, 0) + 3, 19)
    p, _ = start_arbiter("--bind", "127.0.0.1:0", "--cpu", str(cpu), "--priority", "nice=%d" % nice)
    try:
        threads = _threads(p.pid)
    finally:
        p.terminate()
        _, err = p.communicate(timeout=10)
    assert len(threads) >= 2, threads          # the main thread and the loop thread
    assert threads == [(str(cpu), 0, nice)] * len(threads), threads
    assert "pinned to CPU %d; at nice %d" % (cpu, nice) in err
    assert p.returncode == 0


def _refusing_prefix():
    """A command prefix under which SCHED_FIFO is refused (None: none found)."""
    if os.geteuid() != 0:
        soft, _ = resource.getrlimit(resource.RLIMIT_RTPRIO)
        return [] if soft == 0 else None
    if shutil.which("setpriv"):
        return ["setpriv", "--bounding-set", "-sys_nice"]      # root without CAP_SYS_NICE
    return None


@needs(LINUX and _refusing_prefix() is not None,
       "needs Linux and, as root, setpriv (to run the arbiter without CAP_SYS_NICE)")
def test_refused_realtime_exits_1_naming_the_option():
    r = subprocess.run(_refusing_prefix() + [sys.executable, "-m", "horovod_prio.cli", "arbiter",
                                             "--bind", "127.0.0.1:0", "--priority", "realtime"],
                       capture_output=True, text=True, timeout=20,
                       env=_env(HOROVOD_PRIO_ARBITER_SECRET=SECRET))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "horovod-prio arbiter: --priority realtime=10: not permitted" in r.stderr
    assert "listening" not in r.stdout


# ---------------------------------------------------------------- the clients' I/O thread

from test_arbiter_net import client_class, client_factory, key, server_factory  # noqa: E402,F401


def _nice():
    return os.getpriority(os.PRIO_PROCESS, 0)


@needs(LINUX and _nice() <= 17, "needs Linux (/proc) and a nice value <= 17 to raise")
def test_client_io_thread_takes_its_priority(server_factory, client_factory):  # noqa: F811
    mine = _nice()
    srv = server_factory(credit_bytes=100)
    c, g = client_factory(srv.address, "A", io_priority="nice=%d" % (mine + 2))
    c.request(key("x"), 1, 10)
    assert g.wait_for("x")
    niced = [t for t in _threads(os.getpid()) if t[2] == mine + 2]
    assert len(niced) == 1, _threads(os.getpid())        # the client's I/O thread alone
    assert _nice() == mine                                # not the caller's thread


@pytest.mark.parametrize("bad", ["fifo", "realtime=0", "nice=20", ("nice", 30), 5])
def test_client_io_priority_is_checked(client_class, bad):  # noqa: F811
    with pytest.raises(ValueError, match=r"io_priority must be realtime, realtime=N"):
        client_class("127.0.0.1:9", "L", "A", SECRET, lambda k: None, io_priority=bad)


def test_client_from_config_passes_the_io_priority():
    from horovod_prio.arbiter.client import client_from_config
    from horovod_prio.method.config import PriorityConfig
    seen = {}

    def cls(*a, **kw):
        seen.update(kw)
    cfg = PriorityConfig.from_env({}, arbiter="127.0.0.1:9", link="l", arbiter_secret=SECRET,
                                  arbiter_io_priority="realtime=20")
    client_from_config(cfg, on_grant=None, client_cls=cls)
    assert seen["io_priority"] == ("realtime", 20)


_REFUSED = r"""
import json, logging, sys
from horovod_prio.arbiter.server import ArbiterServer
records = []
class H(logging.Handler):
    def emit(self, r):
        records.append((r.levelname, r.getMessage()))
logging.getLogger("horovod_prio.arbiter").addHandler(H())
logging.getLogger("horovod_prio.arbiter").setLevel(logging.INFO)
if sys.argv[1] == "native":
    from horovod_prio.scheduler.arbiter_client import NativeArbiterClient as C
else:
    from horovod_prio.arbiter.client import ArbiterClient as C
import threading
srv = ArbiterServer("127.0.0.1", 0, sys.argv[2], credit_bytes=100)
srv.start()
got = threading.Event()
c = C("%s:%d" % srv.address, "L", "A", sys.argv[2], lambda k: got.set(), timeout=1.0,
      io_priority="realtime")
c.request(7, 1, 10)
ok = got.wait(5)
c.close()
srv.stop()
print(json.dumps({"granted": ok, "grants": c.counters["arbiter_grants"], "log": records}))
"""


@needs(LINUX and _refusing_prefix() is not None,
       "needs Linux and, as root, setpriv (to run a client without CAP_SYS_NICE)")
@pytest.mark.parametrize("kind", ["python", pytest.param("native", marks=pytest.mark.scheduler_lib)])
def test_refused_io_priority_is_one_warning_and_the_client_works(kind):
    r = subprocess.run(_refusing_prefix() + [sys.executable, "-c", _REFUSED, kind, SECRET],
                       capture_output=True, text=True, timeout=30, env=_env())
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["granted"] and out["grants"] == 1, out
    warnings = [m for lvl, m in out["log"] if lvl == "WARNING"]
    assert warnings == [
        "arbiter client A: HOROVOD_PRIO_ARBITER_IO_PRIORITY=realtime=10: not permitted: "
        "SCHED_FIFO needs root, CAP_SYS_NICE or an RLIMIT_RTPRIO of at least 10 (systemd: "
        "AmbientCapabilities=CAP_SYS_NICE or LimitRTPRIO=10; docker: --cap-add SYS_NICE); "
        "its I/O thread keeps the default priority"], out["log"]
