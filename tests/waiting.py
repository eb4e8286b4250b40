"""Polling for tests (importable from every test module: pytest.ini's pythonpath)."""
import time


def wait_until(pred, timeout=10.0, step=0.005):
    """Poll ``pred()`` every ``step`` s until it is true or ``timeout`` s have
    passed; return its last value (callers assert on it)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())
