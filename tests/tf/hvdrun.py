"""Launch real `horovodrun -np 2` jobs from tests, always under a timeout."""
import os
import shutil
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONTROLLERS = [c for c in os.environ.get("HOROVOD_PRIO_TEST_CONTROLLERS", "gloo,mpi").split(",") if c]


def have_tf_stack():
    try:
        import horovod.tensorflow  # noqa: F401
        from horovod_prio import cc
        cc.load()
    except Exception as e:  # pragma: no cover - reported as a skip reason
        return str(e)
    return None


def horovodrun(args, controller="gloo", np_=2, timeout=300, env=None, cwd=None):
    """Run ``horovodrun -np 2 -H localhost:2 --<controller> python ARGS``.

    Returns CompletedProcess (stdout+stderr merged). On timeout the whole
    process group is killed and the test fails with the output so far.
    """
    exe = shutil.which("horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    assert exe, "horovodrun not found next to %s" % sys.executable
    cmd = [exe, "-np", str(np_), "-H", "localhost:%d" % np_, "--" + controller]
    if controller == "gloo":
        cmd += ["--network-interface", "lo"]
    cmd += [sys.executable] + list(args)
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
                    OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                    OMPI_MCA_btl="self,tcp", OMPI_MCA_btl_tcp_if_include="lo",
                    OMPI_MCA_oob_tcp_if_include="lo",
                    PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env.update(env or {})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, cwd=cwd or ROOT, start_new_session=True)
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
