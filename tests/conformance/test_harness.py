"""The conformance harness (tools/horovod_tests.py) itself: it changes exactly
one line of a suite, reads every rank's JUnit result, and judges a swapped run
against plain Horovod's by the rule it states. Synthetic inputs only; the real
suites run with ``make conformance HOROVOD_SRC=...``."""
import importlib.util
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("horovod_tests",
                                               os.path.join(ROOT, "tools", "horovod_tests.py"))
ht = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ht)


def test_swap_changes_exactly_the_import_line():
    text = "import os\nimport horovod.tensorflow.keras as hvd\nx = hvd.size()\n"
    out = ht.swap_import(text, "import horovod.tensorflow.keras as hvd",
                         "import horovod_prio.tensorflow.keras as hvd", "t.py")
    assert out == "import os\nimport horovod_prio.tensorflow.keras as hvd\nx = hvd.size()\n"


@pytest.mark.parametrize("text", ["import os\n",
                                  "import horovod.tensorflow as hvd\nimport horovod.tensorflow as hvd\n"])
def test_swap_refuses_zero_or_two_matches(text):
    with pytest.raises(ht.SourceError, match="exactly one line"):
        ht.swap_import(text, "import horovod.tensorflow as hvd",
                       "import horovod_prio.tensorflow as hvd", "t.py")


def _junit(path, cases):
    body = []
    for name, outcome in cases.items():
        inner = {"passed": "", "failed": "<failure message='x'/>", "error": "<error message='x'/>",
                 "skipped": "<skipped message='x'/>"}[outcome]
        body.append("<testcase classname='m.C' name='%s'>%s</testcase>" % (name, inner))
    path.write_text("<testsuites><testsuite>%s</testsuite></testsuites>" % "".join(body))
    return str(path)


def test_parse_junit_reads_every_outcome(tmp_path):
    got = ht.parse_junit(_junit(tmp_path / "r.xml", {"a": "passed", "b": "failed", "c": "error",
                                                     "d": "skipped"}))
    assert got == {"m.C::a": "passed", "m.C::b": "failed", "m.C::c": "failed", "m.C::d": "skipped"}


def _run(ranks, np=2):
    return {"ranks": ranks, "np": np, "rc": 0, "log": "log"}


def test_compare_rule():
    plain = _run({"0": {"t::a": "passed", "t::b": "skipped", "t::c": "failed", "t::d": "passed"},
                  "1": {"t::a": "passed", "t::b": "skipped", "t::c": "failed", "t::d": "passed"}})
    same = _run({"0": dict(plain["ranks"]["0"]), "1": dict(plain["ranks"]["1"])})
    assert ht.compare(plain, same) == []
    # a test plain Horovod fails may fail or pass after the swap; a skip may pass
    better = _run({"0": {"t::a": "passed", "t::b": "passed", "t::c": "passed", "t::d": "passed"},
                   "1": {"t::a": "passed", "t::b": "skipped", "t::c": "failed", "t::d": "passed"}})
    assert ht.compare(plain, better) == []
    worse = _run({"0": {"t::a": "passed", "t::b": "failed", "t::c": "failed", "t::d": "passed"},
                  "1": {"t::a": "skipped", "t::b": "skipped", "t::c": "failed"}})
    problems = ht.compare(plain, worse)
    assert any("t::b (rank 0): plain Horovod skipped, the swap failed" in p for p in problems)
    assert any("t::a (rank 1): plain Horovod passed, the swap skipped" in p for p in problems)
    assert any("t::d (rank 1): plain Horovod passed, the swap None" in p for p in problems)
    assert len(problems) == 3
    one_rank = _run({"0": dict(plain["ranks"]["0"])})
    assert any("results from 1 of 2 ranks" in p for p in ht.compare(plain, one_rank))
    extra = _run({r: dict(t, **{"t::new": "passed"}) for r, t in plain["ranks"].items()})
    assert ht.compare(plain, extra) == ["t::new: not in plain Horovod's run"]


def test_materialize_reads_a_git_directory_at_the_tag(tmp_path):
    """--src may be a git directory (as a mirror has it): files come from the tag."""
    work = tmp_path / "w"
    work.mkdir()
    files = {"test/conftest.py": "# c\n", "test/utils/common.py": "# u\n",
             "test/parallel/base_test_tensorflow.py": "# b\n",
             "test/parallel/test_tensorflow2_keras.py": "import horovod.tensorflow.keras as hvd\n"}
    for rel, text in files.items():
        os.makedirs(work / os.path.dirname(rel), exist_ok=True)
        (work / rel).write_text(text)
    git = ["git", "-C", str(work), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    subprocess.run(git + ["tag", ht.HOROVOD_TAG], check=True)
    (work / "test/parallel/test_tensorflow2_keras.py").write_text("changed after the tag\n")
    dest = tmp_path / "out"
    path = ht.materialize(str(work / ".git"), "keras", True, str(dest))
    assert open(path).read() == "import horovod_prio.tensorflow.keras as hvd\n"
    assert (dest / "test/utils/common.py").read_text() == "# u\n"
    with pytest.raises(ht.SourceError, match="neither"):
        ht.read_source(str(tmp_path / "nowhere"), "test/conftest.py")


def test_cli_names_a_bad_suite():
    with pytest.raises(SystemExit):
        ht.main(["--src", ROOT, "--suite", "kerass"])
