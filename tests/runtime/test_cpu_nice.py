"""cpu_nice: the runtime sets every thread of the process, the ones started
before the set-up included, and its session's autogroup; a refusal is one
warning. Each case runs in its own interpreter and session (as horovodrun
starts a rank): a nice value cannot always be taken back, and an autogroup's
is the whole session's."""
import json
import os
import subprocess
import sys
import textwrap

from horovod_prio.runtime import cpu

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the scripts import tests/proc_nice.py
PYTHONPATH = os.pathsep.join([REPO, os.path.join(REPO, "tests")])

SCRIPT = textwrap.dedent("""
    import json, logging, os, sys, threading
    from proc_nice import autogroup_nice, thread_nices
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from horovod_prio.method.config import PriorityConfig
    from horovod_prio.runtime.runtime import Runtime
    from horovod_prio.scheduler import Scheduler
    if sys.argv[2] == "nobody" and os.geteuid() == 0:   # imports done: drop root
        os.setgid(65534)
        os.setuid(65534)

    stop = threading.Event()
    before = threading.Thread(target=stop.wait, daemon=True)   # e.g. TF's pools
    before.start()
    rt = Runtime(scheduler_factory=Scheduler)
    rt.setup(PriorityConfig.from_env({}, cpu_nice=int(sys.argv[1])), 0, 1)
    after = threading.Thread(target=stop.wait, daemon=True)
    after.start()
    print(json.dumps({"all": thread_nices(), "before": before.native_id, "after": after.native_id,
                      "main": threading.get_native_id(), "autogroup": autogroup_nice()}))
    stop.set()
    rt.shutdown()
""")


def run(nice, start_nice=0, as_nobody=False):
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    env.pop("HOROVOD_PRIO_CPU_NICE", None)
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(nice), "nobody" if as_nobody else "-"],
                       capture_output=True, text=True, timeout=120, env=env,
                       preexec_fn=lambda: os.nice(start_nice), cwd="/",
                       start_new_session=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), p.stderr


def test_every_thread_takes_the_nice_value_those_started_before_the_setup_too():
    got, err = run(7)
    assert set(got["all"].values()) == {7}, got
    assert str(got["before"]) in got["all"] and str(got["after"]) in got["all"]
    # autogroups on (this kernel's default): the session's group weight follows
    assert cpu.autogroup_enabled(), "the test machine's kernel runs without autogroups"
    assert got["autogroup"] == 7, got["autogroup"]
    assert "threads and its session's autogroup at nice 7 (HOROVOD_PRIO_CPU_NICE)" in err


def started(start_nice):
    """The nice value a child starts at after ``os.nice(start_nice)`` (tests may run niced)."""
    return min(19, os.getpriority(os.PRIO_PROCESS, 0) + start_nice)


def test_unset_leaves_the_process_alone():
    got, _ = run(19, start_nice=2)
    assert set(got["all"].values()) == {19}
    # and without the field: the start value stays
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    env.pop("HOROVOD_PRIO_CPU_NICE", None)
    code = SCRIPT.replace("cpu_nice=int(sys.argv[1])", "")
    p = subprocess.run([sys.executable, "-c", code, "0", "-"], capture_output=True, text=True,
                       timeout=120, env=env, preexec_fn=lambda: os.nice(2), cwd="/",
                       start_new_session=True)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert set(got["all"].values()) == {started(2)}
    assert got["autogroup"] == 0


def test_a_refused_value_is_one_warning_naming_the_setting_and_the_job_runs_on():
    got, err = run(-1, start_nice=1, as_nobody=True)
    assert set(got["all"].values()) == {started(1)}
    assert err.count("HOROVOD_PRIO_CPU_NICE=-1 not permitted") == 1, err
    assert "CAP_SYS_NICE" in err
