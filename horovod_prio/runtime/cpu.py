"""The process's CPU priority (``cpu_nice``, and the lower class's automatic
nice). Stdlib only.

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

:class:`LowerClassNice` is the automatic version (``class_auto``): the
runtime's class watcher calls it when a higher class joins or leaves the
job's link; it nices the process and returns it to the values it found.
"""
import logging
import os
import threading

ENV = "HOROVOD_PRIO_CPU_NICE"
AUTOGROUP = "/proc/self/autogroup"
LOWER_CLASS_NICE = 19


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


def autogroup_nice():
    """The session's autogroup nice value (None without autogroups)."""
    if not autogroup_enabled():
        return None
    try:
        with open(AUTOGROUP) as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _refused(n, log):
    log.warning("horovod_prio: %s=%d not permitted: a nice value below the current one needs "
                "root, CAP_SYS_NICE or RLIMIT_NICE (systemd: Nice=%d); the process keeps its "
                "priority", ENV, n, n)
    return False


def apply_nice(n, group=None):
    """Every thread at nice ``n`` and, where autogroups are on, the session's
    autogroup at ``group`` (default ``n``). -> ``(threads, group_set, error)``:
    ``error`` None, ``"refused"`` (a value below the current one without
    CAP_SYS_NICE: nothing more is changed), ``"group refused"`` (the
    autogroup's value was refused; the threads are set) or the autogroup's
    OSError text (the threads are set)."""
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
                return done, False, "refused"
        done |= todo
    if not autogroup_enabled():
        return done, False, None
    try:
        with open(AUTOGROUP, "w") as f:
            f.write(str(n if group is None else group))
    except PermissionError:
        return done, False, "group refused"       # the threads are set
    except OSError as e:
        return done, False, "%s: %s" % (AUTOGROUP, e.strerror or e)
    return done, True, None


def set_process_nice(n, log):
    """Every thread of the process at nice ``n``, and its session's autogroup
    where autogroups are on. A refusal (a value below the current one without
    CAP_SYS_NICE) is one warning and the process keeps its priority: it never
    stops a job. Returns whether it was applied."""
    done, group, error = apply_nice(n)
    if error in ("refused", "group refused"):
        return _refused(n, log)
    if error:
        log.warning("horovod_prio: %s=%d: the session's autogroup keeps its nice value "
                    "(%s); the threads are set", ENV, n, error)
    log.info("horovod_prio: %d threads%s at nice %d (%s)", len(done),
             " and its session's autogroup" if group else "", n, ENV)
    return True


class LowerClassNice:
    """``on_class_state(higher)``: while a higher class is connected to the
    job's link, the process at nice :data:`LOWER_CLASS_NICE` (its threads and
    autogroup); when none is, back to the values found at the first change.
    Going back lowers the nice value, which needs root, CAP_SYS_NICE or
    RLIMIT_NICE: refused, it is one warning and the process stays niced (it
    is not niced again either). Thread-safe; ``apply`` is :func:`apply_nice`
    (tests replace it)."""

    def __init__(self, log=None, nice=LOWER_CLASS_NICE, apply=apply_nice):
        self.log = log or logging.getLogger("horovod_prio")
        self.nice = nice
        self.apply = apply
        self.lock = threading.Lock()
        self.niced = False
        self.stuck = False          # going back was refused
        self.changes = 0            # nice/un-nice applied
        # (thread nice, autogroup nice) to go back to, read now: before this job's watcher can
        # nice anything. Ranks that share a session (Open MPI's launcher starts them in one)
        # share its autogroup, so one rank's nice moves its siblings' autogroup; read later,
        # a sibling's 19 would become this rank's value to go back to
        self.original = (os.getpriority(os.PRIO_PROCESS, 0), autogroup_nice())

    def on_class_state(self, higher):
        with self.lock:
            if higher and not self.niced and not self.stuck:
                if self.original[0] >= self.nice:
                    return              # already as low (e.g. started niced): nothing to do
                _, _, error = self.apply(self.nice)
                if error == "refused":  # raising a value is always allowed; be safe
                    self.stuck = True
                    return
                if error:               # the threads are set, the autogroup is not
                    self.log.info("horovod_prio: the session's autogroup keeps its nice value "
                                  "(%s); the threads are set", error)
                self.niced = True
                self.changes += 1
                self.log.info("horovod_prio: a higher job class is on this job's link: the "
                              "process runs at nice %d while it is (HOROVOD_PRIO_CLASS_AUTO=0 "
                              "turns this off)", self.nice)
            elif not higher and self.niced:
                n, group = self.original
                if group is not None and group >= self.nice > n:
                    group = n           # a sibling rank had niced the shared autogroup already
                _, _, error = self.apply(n, group)
                self.niced = False
                if error in ("refused", "group refused"):
                    self.stuck = True
                    self.log.warning(
                        "horovod_prio: no higher job class on this job's link any more, but "
                        "going back from nice %d to %d needs root, CAP_SYS_NICE or RLIMIT_NICE: "
                        "the process stays at nice %d (HOROVOD_PRIO_CLASS_AUTO=0 keeps it at "
                        "its own value)", self.nice, n, self.nice)
                    return
                self.changes += 1
                self.log.info("horovod_prio: no higher job class on this job's link: the "
                              "process is back at nice %d", n)
