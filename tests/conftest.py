"""Shared pytest set-up (no TensorFlow import at collection).

Tests are grouped by layer (see README "Tests"): ``method/`` (pure Python),
``scheduler/`` (the C++ release rule and its C API), ``runtime/``, ``tf/``
(the TensorFlow binding, multi-process tests under real ``horovodrun``),
``arbiter/``, ``sim/`` and ``bench/`` (the benchmark harness).

Markers for what a test needs:

* ``tf_stack`` - TensorFlow, horovod (with TensorFlow) and horovod_prio's
  built libraries;
* ``compiler`` - ``g++``;
* ``scheduler_lib`` - the built scheduler library.

A test whose need is missing is skipped with the reason - except under
``CI=true`` or ``HOROVOD_PRIO_REQUIRE_STACK=1`` (``make test`` sets it: it
has just installed the stack), where it FAILS with the reason: a broken
install must never turn into a green run.
"""
import functools
import os
import shutil

import pytest

from stack_required import stack_missing


@functools.lru_cache(maxsize=None)
def missing(need):
    """Why ``need`` is not available here (None if it is)."""
    try:
        if need == "compiler":
            return None if shutil.which("g++") else "g++ is not installed"
        if need == "scheduler_lib":
            from horovod_prio.scheduler import Scheduler
            Scheduler()  # loads and checks libhvdprio_scheduler.so
            return None
        if need == "tf_stack":
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            import horovod.tensorflow  # noqa: F401
            from horovod_prio.tensorflow import ops
            ops.load()
            if not shutil.which("horovodrun"):
                return "horovodrun is not on PATH"
            return None
    except Exception as e:  # reported as the skip/fail reason
        return "%s: %s" % (type(e).__name__, e)
    raise ValueError("unknown need %r" % need)


NEEDS = ("tf_stack", "compiler", "scheduler_lib")


def pytest_configure(config):
    config.addinivalue_line("markers", "stack_missing(reason): set by stack_required.needs; "
                                       "a reason means skip, or fail where the stack is required")
    for need in NEEDS:
        config.addinivalue_line("markers", "%s: the test needs %s (see tests/conftest.py)"
                                % (need, need))


def pytest_runtest_setup(item):
    for mark in item.iter_markers("stack_missing"):        # stack_required.needs(...)
        if mark.kwargs.get("reason"):
            stack_missing(mark.kwargs["reason"])
    for need in NEEDS:
        if item.get_closest_marker(need) is None:
            continue
        why = missing(need)
        if why is None:
            continue
        stack_missing("%s missing: %s" % (need, why))


@pytest.fixture
def clean_env(monkeypatch):
    """Remove every ``HOROVOD_PRIO_*`` variable from ``os.environ`` for one test
    and return the monkeypatch so the test can set its own."""
    for name in list(os.environ):
        if name.startswith("HOROVOD_PRIO_"):
            monkeypatch.delenv(name, raising=False)
    return monkeypatch
