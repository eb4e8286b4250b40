"""What glibc malloc does with one big block in this process: malloc it,
touch it, free it, and report where it lived and how much of it the process
kept. For the malloc-tuning tests, which run it in a fresh interpreter
(``mallopt`` settings are process-wide and cannot be taken back)."""
import ctypes
import os

BLOCK = 100 << 20


def _heap():
    """The ``[heap]`` mapping (the main arena's brk area) as (start, end), or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip().endswith("[heap]"):
                lo, hi = line.split()[0].split("-")
                return int(lo, 16), int(hi, 16)
    return None


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def probe(nbytes=BLOCK):
    """``{"in_heap": the block was carved from the brk heap (not its own mmap),
    "kept": resident bytes the process kept after the free}``."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = _rss()
    p = libc.malloc(nbytes)
    assert p, "malloc(%d) failed" % nbytes
    ctypes.memset(p, 1, nbytes)                 # fault every page in
    heap = _heap()
    in_heap = heap is not None and heap[0] <= p < heap[1]
    libc.free(p)
    return {"in_heap": in_heap, "kept": _rss() - before}
