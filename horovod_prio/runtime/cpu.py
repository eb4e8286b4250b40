"""The process's CPU priority (``cpu_nice``). Stdlib only.

Linux keeps a nice value per thread and a new thread takes its creator's.
TensorFlow's and Horovod's threads exist before the first optimizer sets the
process up, so :func:`set_process_nice` sets every thread listed in
``/proc/self/task`` and looks again until a pass finds no new one; threads
started afterwards inherit the value.

A nice value orders threads within one scheduling group only. With the
kernel's autogroups on (``/proc/sys/kernel/sched_autogroup_enabled``, the
default of many distributions), every session is a group of equal weight,
and Horovod's launcher starts each rank in a session of its own
(``setsid``): there the threads' nice values alone change nothing against
another job. So the value is also written to ``/proc/self/autogroup`` (the
weight of this process's session: the rank and its launcher shell).
"""
import os
import threading

ENV = "HOROVOD_PRIO_CPU_NICE"
AUTOGROUP = "/proc/self/autogroup"


def thread_ids():
    """The process's thread ids (only the calling thread's where there is no /proc)."""
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return {threading.get_native_id()}


def autogroup_enabled():
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1" and os.path.exists(AUTOGROUP)
    except OSError:
        return False


def _refused(n, log):
    log.warning("horovod_prio: %s=%d not permitted: a nice value below the current one needs "
                "root, CAP_SYS_NICE or RLIMIT_NICE (systemd: Nice=%d); the process keeps its "
                "priority", ENV, n, n)
    return False


def set_process_nice(n, log):
    """Every thread of the process at nice ``n``, and its session's autogroup
    where autogroups are on. A refusal (a value below the current one without
    CAP_SYS_NICE) is one warning and the process keeps its priority: it never
    stops a job. Returns whether it was applied."""
    done = set()
    while True:
        todo = thread_ids() - done
        if not todo:
            break
        for tid in sorted(todo):
            try:
                os.setpriority(os.PRIO_PROCESS, tid, n)
            except ProcessLookupError:
                pass                      # the thread ended meanwhile
            except PermissionError:
                return _refused(n, log)
        done |= todo
    group = ""
    if autogroup_enabled():
        try:
            with open(AUTOGROUP, "w") as f:
                f.write(str(n))
        except PermissionError:
            return _refused(n, log)
        except OSError as e:
            log.warning("horovod_prio: %s=%d: the session's autogroup keeps its nice value "
                        "(%s: %s); the threads are set", ENV, n, AUTOGROUP, e.strerror or e)
        else:
            group = " and its session's autogroup"
    log.info("horovod_prio: %d threads%s at nice %d (%s)", len(done), group, n, ENV)
    return True
