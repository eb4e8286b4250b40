"""malloc_tuning: a heterogeneous trainer's rank keeps freed big blocks in its
heap (glibc ``mallopt``), a data-parallel rank only when asked, ``0`` never; a
``MALLOC_*_`` variable the user set wins; without glibc nothing changes.

The behaviour is seen in a fresh interpreter per case (``mallopt`` is
process-wide and cannot be taken back): after the set-up, a 100 MB block is
malloc'ed, touched and freed (``tests/malloc_probe.py``). glibc's defaults
map such a block on its own and unmap it at the free; tuned, it comes from
the heap and stays resident for the next allocation.
"""
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from horovod_prio.method.config import PriorityConfig
from horovod_prio.runtime import malloc

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
MB = 1 << 20

SCRIPT = textwrap.dedent("""
    import json, logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    sys.path.insert(0, %r)
    from malloc_probe import probe
    from horovod_prio.method.config import PriorityConfig
    how = sys.argv[1]
    if how == "heter":          # what HeterTrainer does first
        from horovod_prio.runtime import malloc
        malloc.apply(PriorityConfig(), True, logging.getLogger("horovod_prio"))
    elif how == "runtime":      # a data-parallel optimizer's set-up
        from horovod_prio.runtime.runtime import Runtime
        from horovod_prio.scheduler import Scheduler
        rt = Runtime(scheduler_factory=Scheduler)
        rt.setup(PriorityConfig(), 0, 2)
    print(json.dumps(probe()))
    if how == "runtime":
        rt.shutdown()
""" % TESTS)


def run(how, **env):
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", malloc.ENV)}
    full.update(env, PYTHONPATH=REPO)
    p = subprocess.run([sys.executable, "-c", SCRIPT, how], capture_output=True, text=True,
                       timeout=120, env=full, cwd="/")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), p.stderr


def tuned(got):
    return got["in_heap"] and got["kept"] > 90 * MB


def untouched(got):
    return not got["in_heap"] and got["kept"] < 10 * MB


def test_glibc_defaults_map_and_unmap_the_block():
    got, err = run("none")
    assert untouched(got), got
    assert "glibc malloc" not in err


def test_a_heterogeneous_rank_keeps_a_freed_big_block_in_its_heap():
    got, err = run("heter")
    assert tuned(got), got
    assert err.count("glibc malloc keeps freed blocks for reuse (a heterogeneous trainer's "
                     "rank): mmap threshold 256 MiB, trim threshold 1 GiB, top pad 64 MiB") == 1, err


def test_off_keeps_glibc_defaults_on_a_heterogeneous_rank():
    got, err = run("heter", HOROVOD_PRIO_MALLOC_TUNING="0")
    assert untouched(got), got
    assert "glibc malloc" not in err


@pytest.mark.scheduler_lib
def test_a_data_parallel_rank_is_tuned_only_when_asked():
    got, err = run("runtime")
    assert untouched(got), got
    got, err = run("runtime", HOROVOD_PRIO_MALLOC_TUNING="1")
    assert tuned(got), got
    assert "glibc malloc keeps freed blocks for reuse (HOROVOD_PRIO_MALLOC_TUNING=1)" in err


def test_a_malloc_variable_the_user_set_wins():
    """The user's mmap threshold (1 MiB) stays: the block is mapped on its
    own and given back; the settings the user did not give are made."""
    got, err = run("heter", MALLOC_MMAP_THRESHOLD_=str(MB))
    assert untouched(got), got
    assert "trim threshold 1 GiB, top pad 64 MiB; from the environment, kept: " \
           "MALLOC_MMAP_THRESHOLD_" in err, err
    got, err = run("heter", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=%d" % MB)
    assert untouched(got), got
    assert "kept: GLIBC_TUNABLES glibc.malloc.mmap_threshold" in err, err


# ------------------------------------------------- the rule, with a stand-in mallopt
class Mallopt:
    def __init__(self, answer=1):
        self.calls, self.answer = [], answer

    def __call__(self, param, value):
        self.calls.append((param, value))
        return self.answer


def test_the_glibc_parameters_and_values():
    """glibc's M_MMAP_THRESHOLD -3, M_TRIM_THRESHOLD -1, M_TOP_PAD -2."""
    fake = Mallopt()
    assert malloc.tune(logging.getLogger("t"), {}, "why", fake) == {
        "mmap threshold": 256 * MB, "trim threshold": 1 << 30, "top pad": 64 * MB}
    assert sorted(fake.calls) == [(-3, 256 * MB), (-2, 64 * MB), (-1, 1 << 30)]
    fake = Mallopt()
    malloc.tune(logging.getLogger("t"), {"MALLOC_TOP_PAD_": "0",
                                         "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=9"},
                "why", fake)
    assert fake.calls == [(-3, 256 * MB)]


def test_without_glibc_one_line_and_nothing_changes(monkeypatch, caplog):
    monkeypatch.setattr(malloc, "glibc_mallopt", lambda: None)
    with caplog.at_level(logging.INFO, "horovod_prio"):
        assert malloc.tune(logging.getLogger("horovod_prio"), {}, "why") == {}
    assert [r.getMessage() for r in caplog.records] == [
        "horovod_prio: HOROVOD_PRIO_MALLOC_TUNING: the C library is not glibc (no mallopt): "
        "malloc keeps its own settings"]


def test_a_refused_setting_is_a_warning_naming_it(caplog):
    with caplog.at_level(logging.INFO, "horovod_prio"):
        assert malloc.tune(logging.getLogger("horovod_prio"), {}, "why", Mallopt(0)) == {}
    assert len(caplog.records) == 1 and caplog.records[0].levelno == logging.WARNING
    assert "glibc refused mallopt of the mmap threshold and trim threshold and top pad" \
        in caplog.records[0].getMessage()


def test_the_first_set_up_decides_for_the_process(monkeypatch, caplog):
    monkeypatch.setattr(malloc, "_decided", None)
    fake = Mallopt()
    log = logging.getLogger("horovod_prio")
    with caplog.at_level(logging.INFO, "horovod_prio"):
        first = malloc.apply(PriorityConfig.from_env({}), True, log, {}, fake)
        # a later set-up (the heterogeneous trainer's runtime) changes nothing
        assert malloc.apply(PriorityConfig.from_env({}, malloc_tuning=False), False, log, {},
                            fake) is first
    assert first and len(fake.calls) == 3 and len(caplog.records) == 1
    assert malloc.decided() is first
    monkeypatch.setattr(malloc, "_decided", None)
    assert malloc.apply(PriorityConfig.from_env({}), False, log, {}, fake) == {}
    assert malloc.apply(PriorityConfig.from_env({}, malloc_tuning=True), True, log, {}, fake) \
        == {} and len(fake.calls) == 3
