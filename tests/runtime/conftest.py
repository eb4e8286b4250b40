"""Every runtime a test creates is shut down by it: a runtime thread left
running (rank 0 pumps its clock) would take CPU from every later test."""
import threading
import time

import pytest


def _runtime_threads():
    return [t for t in threading.enumerate()
            if t.name.startswith("horovod_prio-runtime") and t.is_alive()]


@pytest.fixture(autouse=True)
def no_runtime_thread_outlives_its_test():
    before = set(_runtime_threads())
    yield
    deadline = time.monotonic() + 5.0
    while True:
        left = [t for t in _runtime_threads() if t not in before]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, "test left runtime thread(s) running: %s" % [t.name for t in left]
