"""class_auto: a process whose job names an arbiter runs at nice 19 (every
thread, the session's autogroup) while a higher job class is connected to
its link, and returns to its own values when none is or the arbiter is gone;
explicit cpu_nice or class_auto=0 leave it alone; a refused return is one
warning. Each case runs in its own interpreter and session (a nice value
cannot always be taken back; an autogroup's is the whole session's)."""
import json
import logging
import os
import subprocess
import sys
import textwrap

from horovod_prio.runtime.cpu import LowerClassNice

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the script imports tests/proc_nice.py
PYTHONPATH = os.pathsep.join([REPO, os.path.join(REPO, "tests")])

SCRIPT = textwrap.dedent("""
    import json, logging, os, sys, threading, time
    from proc_nice import autogroup_nice, thread_nices
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from horovod_prio.arbiter.server import ArbiterServer
    from horovod_prio.arbiter.client import ArbiterClient
    from horovod_prio.method.config import PriorityConfig
    from horovod_prio.runtime.runtime import Runtime
    from horovod_prio.scheduler import Scheduler
    SECRET = "class-auto-test-secret-0123456789"
    srv = ArbiterServer("127.0.0.1", 0, SECRET)
    host, port = srv.start()
    addr = "%s:%d" % (host, port)
    if sys.argv[2] == "nobody" and os.geteuid() == 0:   # the server is up: drop root
        os.setgid(65534)
        os.setuid(65534)
        import ctypes                                # as a user's own process: its /proc
        ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)       # files its own (PR_SET_DUMPABLE)

    def nices():
        return sorted(set(thread_nices().values())), autogroup_nice()

    def settle(want, timeout=10):
        end = time.monotonic() + timeout
        while time.monotonic() < end and nices() != want:
            time.sleep(0.05)
        return nices()

    start = nices()
    kw = json.loads(sys.argv[1])
    rt = Runtime(scheduler_factory=Scheduler)
    rt.setup(PriorityConfig.from_env({}, arbiter=addr, link="L", arbiter_secret=SECRET, **kw), 0, 1)
    if rt.class_watch is not None:
        rt.class_watch.interval = 0.1
    out = {"start": start}
    high = ArbiterClient(addr, "L", "high", SECRET, lambda k: None, job_class=1)
    out["beside"] = settle([19], 19) if rt.class_watch else (time.sleep(1.0), nices())[1]
    high.close()
    out["after"] = settle(start)
    if rt.class_watch is not None:
        high = ArbiterClient(addr, "L", "high", SECRET, lambda k: None, job_class=1)
        out["again"] = settle([19], 19)
        srv.stop()                                   # the arbiter dies with the flag set
        out["arbiter_gone"] = settle(start)
    print(json.dumps(out))
    rt.shutdown()
""")


def run(kw, as_nobody=False, start_nice=0):
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    for k in ("HOROVOD_PRIO_CPU_NICE", "HOROVOD_PRIO_CLASS_AUTO"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(kw),
                        "nobody" if as_nobody else "-"],
                       capture_output=True, text=True, timeout=120, env=env, cwd="/",
                       preexec_fn=lambda: os.nice(start_nice), start_new_session=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_niced_beside_a_higher_class_and_back_after_it_left_or_the_arbiter_died():
    got, err = run({})
    start = got["start"]
    assert start[0] != [19], "the test must start below nice 19"
    assert got["beside"] == [[19], 19], got
    assert got["after"] == start, got
    assert got["again"] == [[19], 19], got
    assert got["arbiter_gone"] == start, got
    assert err.count("a higher job class is on this job's link") == 2
    assert err.count("the process is back at nice %d" % start[0][0]) == 2


def test_explicit_cpu_nice_wins_and_class_auto_off_leaves_the_process_alone():
    got, _ = run({"cpu_nice": 5})
    assert got["beside"] == [[5], 5] and got["after"] == got["beside"], got
    got, _ = run({"class_auto": False})
    assert got["beside"] == got["start"] == got["after"], got


def test_a_refused_return_is_one_warning_and_the_process_stays_niced():
    """Without CAP_SYS_NICE the return to a lower nice value is refused: one
    warning naming the way out; the job runs on."""
    got, err = run({}, as_nobody=True)
    assert got["beside"] == [[19], 19], got
    assert got["after"] == [[19], 19], got          # could not go back
    assert err.count("needs root, CAP_SYS_NICE or RLIMIT_NICE") == 1, err
    assert "HOROVOD_PRIO_CLASS_AUTO=0" in err


def test_lower_class_nice_applies_once_and_restores_what_it_found(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "getpriority", lambda *a: 3)
    monkeypatch.setattr("horovod_prio.runtime.cpu.autogroup_nice", lambda: 4)
    n = LowerClassNice(logging.getLogger("t"),
                       apply=lambda v, g=None: (calls.append((v, g)), (set(), True, None))[1])
    for s in (True, True, False, False, True, False):
        n.on_class_state(s)
    assert calls == [(19, None), (3, 4), (19, None), (3, 4)]
    assert n.changes == 4 and not n.niced
    already = LowerClassNice(logging.getLogger("t"), nice=2,
                             apply=lambda *a: calls.append(a))
    already.on_class_state(True)                    # at 3 already, lower than asked: untouched
    assert len(calls) == 4 and not already.niced


def test_ranks_sharing_a_session_go_back_to_their_own_values_not_a_siblings(monkeypatch):
    """Under Open MPI the ranks share one session, so one autogroup: the values to go back
    to are read when the rank sets up, before a sibling's nice can move the autogroup, and an
    autogroup found at the lower-class value while the threads are not goes back with them."""
    calls = []
    group = [5]
    monkeypatch.setattr(os, "getpriority", lambda *a: 0)
    monkeypatch.setattr("horovod_prio.runtime.cpu.autogroup_nice", lambda: group[0])
    apply = lambda v, g=None: (calls.append((v, g)), (set(), True, None))[1]   # noqa: E731
    n = LowerClassNice(logging.getLogger("t"), apply=apply)
    group[0] = 19                                   # a sibling rank niced the shared autogroup
    n.on_class_state(True)
    n.on_class_state(False)
    assert calls == [(19, None), (0, 5)]
    calls.clear()
    late = LowerClassNice(logging.getLogger("t"), apply=apply)   # set up after the sibling
    late.on_class_state(True)
    late.on_class_state(False)
    assert calls == [(19, None), (0, 0)]
