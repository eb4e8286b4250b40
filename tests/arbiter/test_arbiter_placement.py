"""``horovod-prio arbiter --cpu/--priority``: what is parsed, what is applied
to the serving threads, and the errors when the system refuses. No timing."""
import argparse
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
