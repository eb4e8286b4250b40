"""Reading the binding's Chrome traces (``HOROVOD_PRIO_TRACE``, rank 0 of a job).

Timestamps in the trace are wall-clock microseconds (``time.time() * 1e6``).

- ``trace_events(path)`` -- the events of one trace file (``[]`` if unreadable);
- ``spans(evs, cat, window, tid=None)`` -- (start, end) wall seconds of complete
  ("X") events of a category (e.g. "arbiter", "chunk", "step");
- ``trace_summary(path, window)`` -- a job's arbiter grant waits;
- ``step_breakdown(path, window)`` -- compute / comm per measured step;
- ``union_length(spans)``, ``inflight_fraction(paths, window)``.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path


def trace_events(path: Path) -> list[dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    evs = data.get("traceEvents", []) if isinstance(data, dict) else data
    return [e for e in evs if isinstance(e, dict)] if isinstance(evs, list) else []


def spans(evs, cat, window, tid=None):
    """(start, end) wall seconds of complete ("X") events of ``cat`` (and ``tid``) inside ``window``.

    The binding's trace timestamps are wall-clock microseconds (time.time() * 1e6)."""
    out = []
    for e in evs:
        if e.get("cat") != cat or e.get("ph") != "X" or (tid and e.get("tid") != tid):
            continue
        t0 = float(e.get("ts", 0)) / 1e6
        t1 = t0 + float(e.get("dur", 0)) / 1e6
        if window and (t0 < window[0] or t1 > window[1]):
            continue
        out.append((t0, t1))
    return out


def trace_summary(path: Path, window: tuple[float, float] | None) -> dict | None:
    """Arbiter waits of one job's rank-0 trace: its "arbiter" spans (request -> grant)."""
    evs = trace_events(path)
    if not evs:
        return None
    sp = spans(evs, "arbiter", window)
    waits = [t1 - t0 for t0, t1 in sp]
    if not waits:
        return {"chunks": 0, "wait_total_s": 0.0, "wait_union_s": 0.0, "wait_median_ms": None,
                "wait_max_ms": None}
    return {"chunks": len(waits), "wait_total_s": sum(waits),
            "wait_union_s": union_length(sp),   # time >= 1 chunk waited (not summed)
            "wait_median_ms": statistics.median(waits) * 1e3, "wait_max_ms": max(waits) * 1e3}


def step_breakdown(path: Path, window: tuple[float, float] | None) -> dict | None:
    """Per measured step of one prio job (rank-0 trace, steps inside ``window``):
    ``compute`` = step start -> first chunk ready (forward + backward; no gradient
    is handed to the scheduler before it), ``comm`` = first chunk ready -> last
    chunk done. Medians over the steps, in seconds."""
    evs = trace_events(path)
    steps = spans(evs, "step", window)
    if not steps:
        return None
    ready = sorted(float(e["ts"]) / 1e6 for e in evs if e.get("cat") == "chunk"
                   and e.get("ph") == "i" and (e.get("args") or {}).get("kind") == "ready")
    done = sorted(float(e["ts"]) / 1e6 for e in evs if e.get("cat") == "chunk"
                  and e.get("ph") == "i" and (e.get("args") or {}).get("kind") == "done")
    comp, comm = [], []
    for t0, t1 in steps:
        r = [t for t in ready if t0 <= t <= t1]
        d = [t for t in done if t0 <= t <= t1 + 0.005]
        if r and d:
            comp.append(r[0] - t0)
            comm.append(d[-1] - r[0])
    if not comp:
        return None
    return {"steps": len(comp), "compute_s": statistics.median(comp),
            "comm_s": statistics.median(comm)}


def union_length(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    start = None
    for a, b in sorted(spans):
        if end is None or a > end:
            if end is not None:
                total += end - start
            start, end = a, b
        else:
            end = max(end, b)
    if end is not None:
        total += end - start
    return total


def inflight_fraction(paths: list[Path], window: tuple[float, float] | None) -> float | None:
    """Fraction of ``window`` in which at least one job had a released chunk in flight
    (union of the rank-0 traces' "allreduce" chunk spans, release -> done); 1 - this is the time
    no prio job was even trying to use the link."""
    if not window or window[1] <= window[0]:
        return None
    sp = [s for p in paths for s in spans(trace_events(p), "chunk", window, "allreduce")]
    if not sp:
        return None
    return union_length(sp) / (window[1] - window[0])
