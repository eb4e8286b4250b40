"""Where the arbiter's threads run: CPU pinning and scheduling priority.

Used by ``horovod-prio arbiter --cpu/--priority`` (the service's threads) and
by the arbiter clients' I/O thread (``HOROVOD_PRIO_ARBITER_IO_PRIORITY``; the
native client does the same in C++, ``arbiter_client.cc``). Linux keeps CPU
affinity, policy and nice per thread: each call here applies to the calling
thread, and threads it starts later inherit it. Stdlib only.
"""
import os


class PlacementError(Exception):
    """A placement the system refuses (the message names the setting)."""


def cpu_list(cpus):
    return ",".join(str(c) for c in sorted(cpus))


def apply_cpus(cpus, what):
    """Pin the calling thread to ``cpus`` (a set); ``what`` names the setting."""
    if not hasattr(os, "sched_setaffinity"):
        raise PlacementError("%s: CPU pinning is not supported on this platform" % what)
    allowed = os.sched_getaffinity(0)
    missing = sorted(set(cpus) - allowed)
    if missing:
        raise PlacementError("%s: CPU %s not available to this process (allowed: %s)"
                             % (what, cpu_list(missing), cpu_list(allowed)))
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as e:
        raise PlacementError("%s: cannot pin the arbiter: %s" % (what, e.strerror or e)) from None
    return "pinned to CPU %s" % cpu_list(cpus)


def apply_priority(priority, what):
    """Give the calling thread ``priority`` (``(kind, n)`` from
    ``units.parse_sched_priority``); ``what`` names the setting in errors.
    Returns what was applied, as a phrase."""
    kind, n = priority
    if kind == "realtime":
        if not hasattr(os, "sched_setscheduler"):
            raise PlacementError("%s: real-time scheduling is not supported on this platform"
                                 % what)
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(n))
        except PermissionError:
            raise PlacementError(
                "%s: not permitted: SCHED_FIFO needs root, CAP_SYS_NICE or an RLIMIT_RTPRIO of "
                "at least %d (systemd: AmbientCapabilities=CAP_SYS_NICE or LimitRTPRIO=%d; "
                "docker: --cap-add SYS_NICE)" % (what, n, n)) from None
        except OSError as e:
            raise PlacementError("%s: cannot set SCHED_FIFO: %s" % (what, e.strerror or e)) from None
        return "scheduled SCHED_FIFO at priority %d" % n
    try:
        os.setpriority(os.PRIO_PROCESS, 0, n)
    except PermissionError:
        raise PlacementError(
            "%s: not permitted: a nice value below the current one needs root, CAP_SYS_NICE "
            "or RLIMIT_NICE (systemd: Nice=%d or AmbientCapabilities=CAP_SYS_NICE)"
            % (what, n)) from None
    except OSError as e:
        raise PlacementError("%s: cannot set it: %s" % (what, e.strerror or e)) from None
    return "at nice %d" % n


def spelled(priority):
    """``(kind, n)`` as it is written: ``realtime=10``, ``nice=-5``."""
    return "%s=%d" % priority


IO_PRIORITY_ENV = "HOROVOD_PRIO_ARBITER_IO_PRIORITY"


def io_priority(value):
    """An arbiter client's ``io_priority``: ``None``, a string for
    ``units.parse_sched_priority`` or its ``(kind, n)`` -> ``None`` or
    ``(kind, n)``; ``ValueError`` naming the argument otherwise."""
    if value is None:
        return None
    from horovod_prio.method import units
    text = spelled(value) if isinstance(value, tuple) and len(value) == 2 else value
    try:
        return units.parse_sched_priority(text)
    except (units.BadValue, TypeError):
        raise ValueError("io_priority must be realtime, realtime=N (N in 1..99) or nice=N "
                         "(N in -20..19), got %r" % (value,)) from None


def apply_io_priority(priority, job_id, log):
    """In a client's I/O thread: apply ``priority``; a refusal is one warning
    (the thread keeps its priority: the arbiter never stops a job)."""
    what = "%s=%s" % (IO_PRIORITY_ENV, spelled(priority))
    try:
        done = apply_priority(priority, what)
    except PlacementError as e:
        log.warning("arbiter client %s: %s; its I/O thread keeps the default priority",
                    job_id, e)
        return False
    log.info("arbiter client %s: I/O thread %s", job_id, done)
    return True
