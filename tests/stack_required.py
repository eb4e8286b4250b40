"""When the test stack is required: under ``CI=true`` or
``HOROVOD_PRIO_REQUIRE_STACK=1`` (``make test``) a missing part of the stack
fails the test instead of skipping it. A module of its own (on the path via
pytest.ini's ``pythonpath``) so that test modules can import it: the name
``conftest`` is taken by more than one file."""
import importlib
import os

import pytest


def require_stack():
    ci = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
    return ci or os.environ.get("HOROVOD_PRIO_REQUIRE_STACK", "").strip() == "1"


def import_stack_module(name):
    """``name`` imported; where the stack is required (CI, ``make test``) an
    ImportError fails the module, elsewhere it skips it."""
    if require_stack():
        return importlib.import_module(name)
    return pytest.importorskip(name)


_RULE = " (CI=true / HOROVOD_PRIO_REQUIRE_STACK=1: a missing stack is a failure, not a skip)"


def stack_missing(reason):
    """Inside a test: a part of the stack it needs is missing. Skips with
    ``reason``; where the stack is required, fails with it."""
    if require_stack():
        pytest.fail(reason + _RULE, pytrace=False)
    pytest.skip(reason)


def needs(available, reason):
    """Decorator for tests that need a part of the stack (``available``:
    checked once at collection): runs them when it is there, otherwise
    :func:`stack_missing` (``tests/conftest.py`` applies the marker)."""
    return pytest.mark.stack_missing(reason=None if available else reason)
