"""``horovod-prio check`` as a user runs it: a real process against a real
arbiter on loopback, a damaged op library, a bad configuration value."""
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.tf_stack, pytest.mark.timeout(300)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "check-test-secret-of-some-length"


def _env(root=ROOT, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_PRIO_")}
    env["PYTHONPATH"] = root
    env.update(extra)
    return env


def run_check(tmp_path, root=ROOT, **env):
    return subprocess.run([sys.executable, "-m", "horovod_prio.cli", "check"], cwd=str(tmp_path),
                          env=_env(root, **env), capture_output=True, text=True, timeout=240)


def start_arbiter(secret_file):
    p = subprocess.Popen([sys.executable, "-m", "horovod_prio.cli", "arbiter", "--bind",
                          "127.0.0.1:0", "--secret-file", str(secret_file)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    m = re.search(r"listening on ([\d.]+):(\d+)", p.stdout.readline())
    if not m:
        p.kill()
        raise AssertionError("arbiter did not start: %r" % p.stderr.read())
    return p, "%s:%s" % m.groups()


def line(out, what):
    """The report line of check ``what`` (with its fix line, if any)."""
    m = re.search(r"^\[(\S+) *\] %s +(.*)\n(?: +fix: (.*)\n)?" % re.escape(what), out, re.M)
    assert m, "no %r line in:\n%s" % (what, out)
    return m.group(1), m.group(2), m.group(3)


def test_check_reports_the_stack_and_authenticates_at_the_arbiter(tmp_path):
    good, bad = tmp_path / "secret", tmp_path / "wrong"
    good.write_text(SECRET + "\n")
    bad.write_text("another-secret-of-some-length\n")
    arbiter, addr = start_arbiter(good)
    try:
        r = run_check(tmp_path, HOROVOD_PRIO_ARBITER=addr, HOROVOD_PRIO_LINK="eth9",
                      HOROVOD_PRIO_ARBITER_SECRET_FILE=str(good))
        assert r.returncode == 0, r.stdout + r.stderr
        import tensorflow as tf
        import horovod
        assert line(r.stdout, "TensorFlow")[:2] == ("ok", tf.__version__)
        assert re.match(r"tf\.keras is (Keras 2|tf_keras) ", line(r.stdout, "Keras")[1])
        assert line(r.stdout, "Horovod")[1].startswith(horovod.__version__ + " (frameworks built: "
                                                       "TensorFlow")
        status, build, _ = line(r.stdout, "Horovod build")
        assert status == "ok" and "Gloo" in build.split(";")[0] and "controllers:" in build
        assert line(r.stdout, "scheduler library")[0] == "ok"
        assert line(r.stdout, "TF kernel library")[0] == "ok"
        assert line(r.stdout, "configuration")[0] == "ok"
        status, detail, _ = line(r.stdout, "arbiter")
        assert status == "ok" and "%s (link eth9) answers, secret accepted" % addr in detail
        assert r.stdout.rstrip().endswith("all checks passed")

        r = run_check(tmp_path, HOROVOD_PRIO_ARBITER=addr, HOROVOD_PRIO_LINK="eth9",
                      HOROVOD_PRIO_ARBITER_SECRET_FILE=str(bad))
        assert r.returncode == 1, r.stdout + r.stderr
        status, detail, fix = line(r.stdout, "arbiter")
        assert status == "FAIL" and "answers but rejects our secret" in detail, r.stdout
        assert "--secret-file" in fix
        assert "1 check(s) failed" in r.stdout
    finally:
        arbiter.send_signal(signal.SIGTERM)
        arbiter.wait(10)


def test_check_fails_with_the_fix_on_a_damaged_op_library_and_a_dead_arbiter(tmp_path):
    copy = tmp_path / "pkg"
    shutil.copytree(os.path.join(ROOT, "horovod_prio"), str(copy / "horovod_prio"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    import tensorflow as tf
    lib = copy / "horovod_prio" / "tensorflow" / "kernels" / (
        "libhvdprio_tf_kernels_tf%s.so" % tf.__version__.replace(".", "_"))
    data = lib.read_bytes()
    lib.write_bytes(data[:4096])                       # a truncated copy
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    r = run_check(tmp_path, root=str(copy), HOROVOD_PRIO_ARBITER="127.0.0.1:1",
                  HOROVOD_PRIO_LINK="eth9", HOROVOD_PRIO_ARBITER_SECRET_FILE=str(secret))
    assert r.returncode == 1, r.stdout + r.stderr
    assert str(copy) in line(r.stdout, "horovod_prio")[1]       # the damaged copy was checked
    assert line(r.stdout, "scheduler library")[0] == "ok"
    status, detail, fix = line(r.stdout, "TF kernel library")
    assert status == "FAIL" and "damaged" in detail, r.stdout
    assert "make install" in fix
    status, detail, fix = line(r.stdout, "arbiter")
    assert status == "FAIL" and "127.0.0.1:1 (link eth9) does not answer" in detail, r.stdout
    assert "horovod-prio arbiter --bind 127.0.0.1:1" in fix
    assert "2 check(s) failed" in r.stdout


def test_check_fails_with_the_fix_on_a_bad_configuration_value(tmp_path):
    r = run_check(tmp_path, HOROVOD_PRIO_NUM_GROUPS="abc")
    assert r.returncode == 1, r.stdout + r.stderr
    status, detail, fix = line(r.stdout, "configuration")
    assert status == "FAIL" and "num_groups" in detail and "HOROVOD_PRIO_NUM_GROUPS" in detail
    assert "'abc'" in detail and "unset" in fix


def test_check_warns_of_a_misspelt_variable_and_rejects_a_bad_timeout(tmp_path):
    r = run_check(tmp_path, HOROVOD_PRIO_NUM_GROPS="3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^\[warn\] configuration .*HOROVOD_PRIO_NUM_GROPS \(did you mean "
                     r"HOROVOD_PRIO_NUM_GROUPS\?\)", r.stdout, re.M), r.stdout
    r = subprocess.run([sys.executable, "-m", "horovod_prio.cli", "check", "--timeout", "-1"],
                       cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--timeout" in r.stderr and "> 0 seconds" in r.stderr, r.stderr
