"""``horovod-prio check``: is this machine's stack ready for horovod_prio?

In the spirit of ``horovodrun --check-build``: prints the versions (Python,
TensorFlow, which Keras ``tf.keras`` is, Horovod with its frameworks,
controllers and tensor operations from Horovod's own build checks), whether
our scheduler and TensorFlow kernel libraries load, whether the
``HOROVOD_PRIO_*`` configuration parses, and, when an arbiter is configured,
whether it answers and accepts the configured secret. Every failure prints
its fix; the exit status is 1 if anything failed, else 0.

Run it on every host of a job (e.g. ``horovodrun -np 2 -H a:1,b:1
horovod-prio check``) with the job's environment.
"""
import argparse
import io
import logging
import os
import platform
import signal
import subprocess
import sys

OK, WARN, FAIL, INFO = "ok", "warn", "FAIL", "info"

REINSTALL = ("make install (or: HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 "
             "pip install --no-build-isolation --no-cache-dir --force-reinstall horovod==0.28.1)")
BUILD_OURS = ("rebuild horovod_prio against the running TensorFlow: `make install`, or "
              "`python setup.py build_ext --inplace` in a source checkout")


class Report:
    def __init__(self, out):
        self.out, self.failures = out, 0

    def line(self, status, what, detail="", fix=None):
        if status == FAIL:
            self.failures += 1
        self.out.write("[%-4s] %-22s %s\n" % (status, what, detail))
        if fix:
            self.out.write("       %-22s fix: %s\n" % ("", fix))


def _versions(r):
    r.line(INFO, "Python", "%s (%s)" % (platform.python_version(), sys.executable))
    from horovod_prio.version import __version__
    r.line(INFO, "horovod_prio", "%s (%s)" % (__version__, os.path.dirname(os.path.abspath(__file__))))


def _tensorflow(r):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except Exception as e:
        r.line(FAIL, "TensorFlow", "import failed: %s: %s" % (type(e).__name__, e),
               "install a supported TensorFlow (2.15.1; or 2.16.2 to 2.19.1, or 2.21.0, with tf_keras): "
               "`make install` or `make install TF=2.16.2`")
        return None
    r.line(OK, "TensorFlow", tf.__version__)
    from horovod_prio import stack
    flavour, problem = stack.running_keras_flavour(tf.__version__)
    keras_v = stack.installed_version("tf_keras" if flavour == stack.TF_KERAS else "keras")
    legacy = os.environ.get(stack.LEGACY_ENV)
    detail = "tf.keras is %s (%s %s%s)" % (
        flavour, "tf_keras" if flavour == stack.TF_KERAS else "keras", keras_v or "not installed",
        ", %s=%s" % (stack.LEGACY_ENV, legacy) if legacy else "")
    if problem:
        r.line(FAIL, "Keras", detail, problem)
    else:
        r.line(OK, "Keras", detail)
    return tf


def _horovod(r):
    try:
        import horovod
    except Exception as e:
        r.line(FAIL, "Horovod", "import failed: %s: %s" % (type(e).__name__, e), REINSTALL)
        return None
    from horovod.common import util as hu
    pkg = os.path.dirname(horovod.__file__)
    frameworks = []
    for name, label, env, lib in (("tensorflow", "TensorFlow", "HOROVOD_WITH_TENSORFLOW", "mpi_lib"),
                                  ("torch", "PyTorch", "HOROVOD_WITH_PYTORCH", "mpi_lib_v2"),
                                  ("mxnet", "MXNet", "HOROVOD_WITH_MXNET", "mpi_lib")):
        try:
            hu.check_extension("horovod." + name, env, os.path.join(pkg, name, "__init__.py"), lib)
            frameworks.append(label)
        except ImportError:
            pass
    r.line(OK, "Horovod", "%s (frameworks built: %s)"
           % (horovod.__version__, ", ".join(frameworks) or "none"))
    try:
        import horovod.tensorflow as hvd
    except Exception as e:
        r.line(FAIL, "Horovod TensorFlow", "import horovod.tensorflow failed: %s: %s"
               % (type(e).__name__, e),
               "rebuild Horovod against this TensorFlow: " + REINSTALL)
        return None
    controllers = [n for n, f in (("MPI", hvd.mpi_built), ("Gloo", hvd.gloo_built)) if f()]
    ops = [n for n, f in (("NCCL", hvd.nccl_built), ("DDL", hvd.ddl_built), ("CCL", hvd.ccl_built),
                          ("MPI", hvd.mpi_built), ("Gloo", hvd.gloo_built)) if f()]
    gpu = [n for n, f in (("CUDA", hvd.cuda_built), ("ROCm", hvd.rocm_built)) if f()]
    detail = "controllers: %s; tensor operations: %s; GPU: %s" % (
        ", ".join(controllers) or "none", ", ".join(ops) or "none", ", ".join(gpu) or "none")
    if not controllers:
        r.line(FAIL, "Horovod build", detail, "rebuild with Gloo or MPI: " + REINSTALL)
    else:
        r.line(OK, "Horovod build", detail)
    return hvd


# Each library is loaded in a child process: a damaged file (truncated, another
# architecture) can kill the process that maps it (SIGBUS), not only raise.
_PROBES = {
    "scheduler library": "from horovod_prio import scheduler as m\n"
                         "m.Scheduler().close()\nprint(m.library_path())",
    "TF kernel library": "import os\nos.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')\n"
                         "from horovod_prio.tensorflow import ops as m\n"
                         "m.load()\nprint(m.kernel_library_path())",
}
_PROBE = """import sys
try:
%s
except Exception as e:
    print('%%s: %%s' %% (type(e).__name__, e))
    sys.exit(3)
"""


def _probe(what):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    code = _PROBE % "\n".join("    " + line for line in _PROBES[what].splitlines())
    try:
        p = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                           text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return False, "loading it did not finish within 300 s"
    out = p.stdout.strip().splitlines()
    if p.returncode == 0 and out:
        return True, out[-1]
    if p.returncode < 0:
        try:
            name = signal.Signals(-p.returncode).name
        except ValueError:
            name = "signal %d" % -p.returncode
        return False, ("loading it killed the process (%s): the file is damaged (truncated, or "
                       "built for another machine)" % name)
    tail = (out or p.stderr.strip().splitlines() or ["exit status %d" % p.returncode])[-1]
    return False, tail


def _libraries(r, have_tf_stack):
    ok, detail = _probe("scheduler library")
    r.line(OK if ok else FAIL, "scheduler library", detail, None if ok else BUILD_OURS)
    if not ok:
        return
    if not have_tf_stack:
        r.line(FAIL, "TF kernel library", "not checked: TensorFlow or Horovod failed above",
               "fix the failures above first")
        return
    ok, detail = _probe("TF kernel library")
    r.line(OK if ok else FAIL, "TF kernel library", detail, None if ok else BUILD_OURS)


def _config(r):
    from horovod_prio.method.config import PriorityConfig
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logger = logging.getLogger("horovod_prio")
    logger.addHandler(handler)
    try:
        cfg = PriorityConfig()
    except ValueError as e:
        r.line(FAIL, "configuration", str(e),
               "correct or unset that variable (docs/usage.md#configuration lists every field)")
        return None
    finally:
        logger.removeHandler(handler)
    set_vars = sorted(k for k in os.environ if k.startswith("HOROVOD_PRIO_"))
    r.line(OK, "configuration", "HOROVOD_PRIO_* parsed (%s)" % (", ".join(set_vars) or "all defaults"))
    for msg in buf.getvalue().splitlines():
        r.line(WARN, "configuration", msg, "remove or correct the variable (a typo?)")
    return cfg


def _arbiter(r, cfg, timeout):
    if cfg is None:
        return
    if not cfg.arbiter:
        r.line(INFO, "arbiter", "not configured (HOROVOD_PRIO_ARBITER unset): the job orders only "
               "its own chunks")
        return
    from horovod_prio.arbiter import protocol as P
    from horovod_prio.arbiter.stats import fetch_stats
    where = "%s (link %s)" % (cfg.arbiter, cfg.link)
    try:
        secret = P.config_secret(cfg)
        if not secret:
            raise ValueError("no secret: set HOROVOD_PRIO_ARBITER_SECRET_FILE")
    except ValueError as e:
        r.line(FAIL, "arbiter", "%s: %s" % (where, e),
               "point HOROVOD_PRIO_ARBITER_SECRET_FILE at a readable file holding the secret the "
               "arbiter was started with (its --secret-file)")
        return
    try:
        stats = fetch_stats(cfg.arbiter, secret, timeout=timeout)
    except P.AuthError as e:
        r.line(FAIL, "arbiter", "%s answers but rejects our secret: %s" % (where, e),
               "use the arbiter's secret: the same file as its --secret-file")
        return
    except Exception as e:
        r.line(FAIL, "arbiter", "%s does not answer: %s: %s" % (where, type(e).__name__, e),
               "start it (`horovod-prio arbiter --bind %s --secret-file FILE`, see README "
               "\"Jobs sharing a link\"), or unset HOROVOD_PRIO_ARBITER (a job whose arbiter is "
               "down trains on: it grants its chunks itself, logs one warning and reconnects)"
               % cfg.arbiter)
        return
    link = (stats.get("links") or {}).get(cfg.link) or {}
    r.line(OK, "arbiter", "%s answers, secret accepted (%d job(s) on this link now)"
           % (where, int(link.get("connected_jobs", 0))))


def run(out=None, timeout=3.0):
    """Run every check, write the report to ``out``; returns the number of failures."""
    r = Report(out or sys.stdout)
    _versions(r)
    tf = _tensorflow(r)
    hvd = _horovod(r) if tf is not None else None
    _libraries(r, tf is not None and hvd is not None)
    cfg = _config(r)
    _arbiter(r, cfg, timeout)
    r.out.write("%s\n" % ("all checks passed" if not r.failures else
                          "%d check(s) failed (see fix: above)" % r.failures))
    return r.failures


def main(argv=None):
    p = argparse.ArgumentParser(prog="horovod-prio check", description=__doc__.split("\n\n")[0])
    from horovod_prio.method import units
    p.add_argument("--timeout", type=units.arg(units.parse_float, 0, strict=True, unit=" seconds"),
                   default=3.0,
                   help="seconds to wait for the arbiter (default 3)")
    args = p.parse_args(argv)
    return 1 if run(timeout=args.timeout) else 0
