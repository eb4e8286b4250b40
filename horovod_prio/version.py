"""The one place the version of horovod_prio is written (setup.py reads it)."""
__version__ = "0.2.0"
