"""Shared pytest fixtures (generic; no TensorFlow import here)."""
import os

import pytest


@pytest.fixture
def clean_env(monkeypatch):
    """Remove every ``HOROVOD_PRIO_*`` variable from ``os.environ`` for one test
    and return the monkeypatch so the test can set its own."""
    for name in list(os.environ):
        if name.startswith("HOROVOD_PRIO_"):
            monkeypatch.delenv(name, raising=False)
    return monkeypatch
