"""The Chrome trace survives a crash: a writer killed with SIGKILL at any
moment - also while events it has not flushed yet pile up - leaves a file
that loads (only the closing bracket may be missing) with every event flushed
before the kill."""
import json
import os
import signal
import subprocess
import sys
import time

from horovod_prio.runtime.trace import TraceWriter, load_trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WRITER = r"""
import sys
from horovod_prio.runtime.trace import TraceWriter
w = TraceWriter(sys.argv[1])
i = 0
for _ in range(100):               # 100 "steps", flushed like the runtime does
    for _ in range(50):
        w.instant("e%d" % i, i, "t", "c", {"pad": "x" * (i % 300)})
        i += 1
    w.flush()
print(i, flush=True)
while True:                        # then events keep coming, never flushed (> 64 KiB)
    w.instant("e%d" % i, i, "t", "c", {"pad": "y" * (i % 300)})
    i += 1
    if i % 1000 == 0:
        print(i, flush=True)
"""


def test_killed_writer_leaves_a_loadable_trace(tmp_path):
    path = tmp_path / "t.json"
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                         text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        flushed = int(p.stdout.readline())
        deadline = time.time() + 30
        emitted = flushed
        while emitted < flushed + 3000 and time.time() < deadline:
            emitted = int(p.stdout.readline())
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    assert flushed == 5000 and emitted >= flushed + 3000
    text = path.read_text()
    assert not text.rstrip().endswith("]")          # it really died mid-run
    json.loads(text + "]")                          # strict: no half-written event
    names = [e["name"] for e in load_trace(str(path)) if e.get("ph") == "i"]
    assert names[:flushed] == ["e%d" % i for i in range(flushed)]   # nothing flushed is lost


def test_closed_trace_is_a_complete_array(tmp_path):
    w = TraceWriter(str(tmp_path / "c.json"))
    w.span("s", 1, 2, "t", "c")
    w.close()
    w.close()
    data = json.loads((tmp_path / "c.json").read_text())
    assert [e["name"] for e in data] == ["process_name", "s"]


def test_loader_rejects_a_half_written_event(tmp_path):
    p = tmp_path / "h.json"
    p.write_text('[\n{"name":"a","ph":"i"},\n{"name":"b","p')
    try:
        load_trace(str(p))
    except json.JSONDecodeError:
        return
    raise AssertionError("a half-written event must not load")
