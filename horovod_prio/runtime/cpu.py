"""The process's CPU priority (``cpu_nice``). Stdlib only.

Linux keeps a nice value per thread and a new thread takes its creator's.
TensorFlow's and Horovod's threads exist before the first optimizer sets the
process up, so :func:`set_process_nice` sets every thread listed in
``/proc/self/task`` and looks again until a pass finds no new one; threads
started afterwards inherit the value.
"""
import os
import threading

ENV = "HOROVOD_PRIO_CPU_NICE"


def thread_ids():
    """The process's thread ids (only the calling thread's where there is no /proc)."""
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return {threading.get_native_id()}


def set_process_nice(n, log):
    """Every thread of the process at nice ``n``. A refusal (a value below the
    current one without CAP_SYS_NICE) is one warning and the process keeps its
    priority: it never stops a job. Returns whether it was applied."""
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
                log.warning("horovod_prio: %s=%d not permitted: a nice value below the current "
                            "one needs root, CAP_SYS_NICE or RLIMIT_NICE (systemd: Nice=%d); "
                            "the process keeps its priority", ENV, n, n)
                return False
        done |= todo
    log.info("horovod_prio: %d threads at nice %d (%s)", len(done), n, ENV)
    return True
