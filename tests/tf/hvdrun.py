"""Launch real `horovodrun -np 2` jobs from tests, always under a timeout."""
import os
import shutil
import signal
import subprocess
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def parse_controllers(text):
    """``HOROVOD_PRIO_TEST_CONTROLLERS`` -> list; an empty or unknown value is an
    error (an empty list would turn every horovodrun test into a skip)."""
    ctls = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in ctls if c not in ("gloo", "mpi")]
    if not ctls or bad:
        raise ValueError("HOROVOD_PRIO_TEST_CONTROLLERS=%r: give gloo, mpi or gloo,mpi" % text)
    return ctls


CONTROLLERS = parse_controllers(os.environ.get("HOROVOD_PRIO_TEST_CONTROLLERS", "gloo,mpi"))


def command(args, controller="gloo", np_=2, hosts=True):
    exe = shutil.which("horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    assert exe, "horovodrun not found next to %s" % sys.executable
    cmd = [exe, "-np", str(np_)] + (["-H", "localhost:%d" % np_] if hosts else []) + ["--" + controller]
    if controller == "gloo":
        cmd += ["--network-interface", "lo"]
    return cmd + [sys.executable] + list(args)


def environment(env=None):
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
                    OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                    OMPI_MCA_btl="self,tcp", OMPI_MCA_btl_tcp_if_include="lo",
                    OMPI_MCA_oob_tcp_if_include="lo",
                    # ranks outnumber cores here: an idle MPI rank yields its core
                    # instead of busy-polling it (same results, MPI jobs ~2x faster)
                    OMPI_MCA_mpi_yield_when_idle="1",
                    PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env.update(env or {})
    return full_env


def start(args, controller="gloo", np_=2, env=None, cwd=None, out=None):
    """``horovodrun`` as a background process (own session: kill with killpg)."""
    cmd = command(args, controller, np_)
    return subprocess.Popen(cmd, stdout=out or subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=environment(env), cwd=cwd or ROOT,
                            start_new_session=True)


def horovodrun(args, controller="gloo", np_=2, timeout=300, env=None, cwd=None, extra=()):
    """Run ``horovodrun -np 2 -H localhost:2 --<controller> python ARGS`` (with
    ``extra`` horovodrun arguments instead of ``-H``, e.g. an elastic launch).

    Returns CompletedProcess (stdout+stderr merged). On timeout the whole
    process group is killed and the test fails with the output so far.
    """
    cmd = command(args, controller, np_, hosts=not extra)
    cmd[1:1] = list(extra)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=environment(env), cwd=cwd or ROOT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail("horovodrun timed out after %ss: %s\n%s" % (timeout, " ".join(cmd), out[-6000:]))
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


def check(result):
    assert result.returncode == 0, "exit %s: %s\n%s" % (
        result.returncode, " ".join(result.args), result.stdout[-8000:])
    return result.stdout


def run_with_timeout(fn, timeout=60.0, details=None):
    """Run fn() in a daemon thread; fail (instead of hanging) if it does not finish
    within ``timeout`` s (``details()`` adds to the message). Returns fn()'s value
    and re-raises its exception in the calling thread."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the test thread
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "did not finish within %.0f s%s" % (
        timeout, ": %r" % (details(),) if details else "")
    if "error" in box:
        raise box["error"]
    return box.get("value")
