"""Chrome-trace (Perfetto) writer and reader, no TensorFlow.

The file is a JSON array of trace events written incrementally, one event per
line, so a crashed job still leaves a readable trace (Perfetto and
chrome://tracing accept an array whose closing bracket is missing);
:func:`load_trace` reads both forms.
"""
import json
import os
import threading

PID = 0  # horovod_prio rank 0; Horovod's own timeline uses its own pids


class TraceWriter:
    def __init__(self, path, process_name="horovod_prio rank 0"):
        self.path = path
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        self._f = open(path, "w", buffering=1 << 16)
        self._lock = threading.Lock()
        self._f.write("[\n")
        self._first = True
        self.emit({"name": "process_name", "ph": "M", "pid": PID,
                   "args": {"name": process_name}})

    def emit(self, event):
        line = json.dumps(event, separators=(",", ":"))
        with self._lock:
            if self._f is None:
                return
            self._f.write(line if self._first else ",\n" + line)
            self._first = False

    def span(self, name, ts_us, dur_us, tid, cat, args=None):
        self.emit({"name": name, "ph": "X", "pid": PID, "tid": tid, "ts": ts_us,
                   "dur": max(0, dur_us), "cat": cat, "args": args or {}})

    def instant(self, name, ts_us, tid, cat, args=None):
        self.emit({"name": name, "ph": "i", "s": "t", "pid": PID, "tid": tid, "ts": ts_us,
                   "cat": cat, "args": args or {}})

    def flush(self):
        with self._lock:
            if self._f is not None:
                self._f.flush()

    def close(self):
        with self._lock:
            if self._f is None:
                return
            self._f.write("\n]\n")
            self._f.close()
            self._f = None


def load_trace(path):
    """Events of a trace written by :class:`TraceWriter` (closed or not)."""
    with open(path) as f:
        text = f.read().strip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"
    data = json.loads(text)
    return data["traceEvents"] if isinstance(data, dict) else data
