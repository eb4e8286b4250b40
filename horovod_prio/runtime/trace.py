"""Chrome-trace (Perfetto) output of a job, and the reader. No TensorFlow.

:class:`TraceWriter` writes a JSON array of trace events. Events are written
in whole lines with one ``os.write`` per flush, never through a user-space
buffer, so a job killed at any moment (even ``kill -9``) leaves a file that
ends with a complete event: the only thing missing is the closing ``]``, which
Perfetto and chrome://tracing accept. :func:`load_trace` reads both forms.

:class:`ChunkTracer` turns the scheduler's chunk events into trace events:
an instant per event, a ``wait`` span (ready -> release), an ``allreduce``
span (release -> done) and, for jobs behind an arbiter, an ``arbiter`` span
(request -> release).
"""
import json
import os
import threading

PID = 0  # horovod_prio; Horovod's own timeline uses its own pids


class TraceWriter:
    def __init__(self, path, process_name="horovod_prio rank 0"):
        self.path = path
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._lock = threading.Lock()
        self._pending = []
        self._first = True
        os.write(self._fd, b"[\n")
        self.emit({"name": "process_name", "ph": "M", "pid": PID, "args": {"name": process_name}})
        self.flush()

    def emit(self, event):
        """Queue one event; it reaches the file at the next :meth:`flush`."""
        line = json.dumps(event, separators=(",", ":"))
        with self._lock:
            if self._fd is None:
                return
            self._pending.append(line if self._first else ",\n" + line)
            self._first = False

    def span(self, name, ts_us, dur_us, tid, cat, args=None):
        self.emit({"name": name, "ph": "X", "pid": PID, "tid": tid, "ts": ts_us,
                   "dur": max(0, dur_us), "cat": cat, "args": args or {}})

    def instant(self, name, ts_us, tid, cat, args=None):
        self.emit({"name": name, "ph": "i", "s": "t", "pid": PID, "tid": tid, "ts": ts_us,
                   "cat": cat, "args": args or {}})

    def flush(self):
        """Write the queued events with one write (whole events only)."""
        with self._lock:
            if self._fd is None or not self._pending:
                return
            data = "".join(self._pending).encode()
            self._pending = []
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]

    def close(self):
        self.flush()
        with self._lock:
            if self._fd is None:
                return
            os.write(self._fd, b"\n]\n")
            os.close(self._fd)
            self._fd = None


def load_trace(path):
    """Events of a trace written by :class:`TraceWriter` (closed or not).

    Strict: the only repair is the missing closing bracket, so a file that
    ends inside an event fails to load (as it would in Perfetto)."""
    with open(path) as f:
        text = f.read().strip()
    if not text.endswith("]"):
        text = text + "]"
    data = json.loads(text)
    return data["traceEvents"] if isinstance(data, dict) else data


def trace_path_for_rank(path, rank):
    """Rank 0 writes ``path`` itself; rank r writes ``<stem>.rank<r><ext>``."""
    if rank == 0:
        return path
    stem, ext = os.path.splitext(path)
    return "%s.rank%d%s" % (stem, rank, ext or ".json")


class ChunkTracer:
    """Spans and instants of the scheduler's chunk events (see the module docstring)."""

    def __init__(self, writer):
        self.writer = writer
        self._ready = {}        # ticket -> ready time
        self._released = {}     # ticket -> release time
        self._requested = {}    # ticket -> request time

    def add(self, events):
        w = self.writer
        for e in events:
            kind, name, ts, ticket = e["kind"], e["name"], e["t_us"], e.get("ticket")
            w.instant("%s %s" % (kind, name), ts, "chunks", "chunk", e)
            args = {"priority": e["priority"], "bytes": e["bytes"]}
            if kind == "ready":
                self._ready[ticket] = ts
            elif kind == "request":
                self._requested[ticket] = ts
            elif kind == "release":
                start = self._ready.pop(ticket, None)
                if start is not None:
                    w.span("wait " + name, start, ts - start, "wait", "chunk", args)
                req = self._requested.pop(ticket, None)
                if req is not None:
                    w.span("arbiter " + name, req, ts - req, "arbiter", "arbiter", args)
                self._released[ticket] = ts
            elif kind in ("done", "abandon"):
                rel = self._released.pop(ticket, None)
                if rel is not None and kind == "done":
                    w.span("allreduce " + name, rel, ts - rel, "allreduce", "chunk", args)
            elif kind == "cancel":
                self._ready.pop(ticket, None)
                self._requested.pop(ticket, None)


__all__ = ["TraceWriter", "ChunkTracer", "load_trace", "trace_path_for_rank", "PID"]
