"""The CPU priority of this process as the kernel reports it: each thread's
nice value (/proc/self/task/*/stat) and its session's autogroup nice
(/proc/self/autogroup). For the cpu_nice and class_auto tests, whose
subprocess scripts import it (tests/ on their sys.path)."""
import os


def thread_nices():
    """``{tid: nice}`` for every thread alive while it reads; one that ends
    meanwhile is left out."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/stat" % tid) as f:
                # field 19 of stat; split after the comm, which may hold spaces
                out[tid] = int(f.read().rsplit(")", 1)[1].split()[16])
        except OSError:
            pass
    return out


def autogroup_nice():
    """The nice value of this process's autogroup (its session's)."""
    with open("/proc/self/autogroup") as f:
        return int(f.read().split()[-1])
