"""Reading the binding's Chrome traces (``HOROVOD_PRIO_TRACE``, rank 0 of a job).

Timestamps in the trace are wall-clock microseconds (``time.time() * 1e6``).

- ``trace_events(path)`` -- the events of one trace file (``[]`` if unreadable);
- ``spans(evs, cat, window, tid=None)`` -- (start, end) wall seconds of complete
  ("X") events of a category (e.g. "arbiter", "chunk", "step");
- ``trace_summary(path, window)`` -- a job's arbiter grant waits and the time it had
  a released chunk in flight;
- ``step_breakdown(path, window)`` -- compute / comm per measured step;
- ``union_length(spans)``, ``inflight_fraction(paths, window)``.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from .results_io import read_json


def trace_events(path: Path) -> list[dict]:
    try:
        data = read_json(path)
    except (OSError, ValueError, EOFError):
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
    """Arbiter waits of one job's rank-0 trace: its "arbiter" spans (request -> grant);
    and ``allreduce_union_s``: the time at least one released chunk was in flight
    (union of its "allreduce" spans, release -> done), which is what the step's
    collectives take beyond their bytes on the wire (``benchmarks.sim_check``
    fits the per-collective overhead on it)."""
    evs = trace_events(path)
    if not evs:
        return None
    sp = spans(evs, "arbiter", window)
    waits = [t1 - t0 for t0, t1 in sp]
    ar = spans(evs, "chunk", window, "allreduce")
    busy = {"allreduce_chunks": len(ar), "allreduce_union_s": union_length(ar)}
    if not waits:
        return {"chunks": 0, "wait_total_s": 0.0, "wait_union_s": 0.0, "wait_median_ms": None,
                "wait_max_ms": None, **busy}
    return {**busy, "chunks": len(waits), "wait_total_s": sum(waits),
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


def overlap_timeline(evs: list[dict], first_step: int, nsteps: int = 2) -> dict:
    """What one picture of barrier crossing needs, from a rank-0 trace of a job
    run with ``hvd.overlap``: the training calls ("steps"), each layer wait of
    the next forward (with whether it blocked), each chunk's allreduce (name,
    priority) and each layer update, from the start of training call
    ``first_step`` to the end of call ``first_step + nsteps - 1``. Times in
    seconds from that start."""
    calls = sorted((e for e in evs if e.get("tid") == "steps" and e.get("ph") == "X"),
                   key=lambda e: e["ts"])
    if len(calls) < first_step + nsteps:
        raise ValueError(f"the trace has {len(calls)} training steps, "
                         f"fewer than {first_step + nsteps}")
    t0 = calls[first_step]["ts"]
    last = calls[first_step + nsteps - 1]
    t1 = last["ts"] + last["dur"]

    def inside(e):                          # overlaps the window
        return e["ts"] <= t1 and e["ts"] + e.get("dur", 0) >= t0

    def sec(us):
        return (us - t0) / 1e6

    out = {"calls": [], "waits": [], "allreduces": [], "applies": []}
    for e in calls[first_step:first_step + nsteps]:
        out["calls"].append((sec(e["ts"]), sec(e["ts"] + e["dur"])))
    for e in evs:
        if "ts" not in e or not inside(e):
            continue
        args = e.get("args", {})
        if e.get("tid") == "overlap wait" and e.get("ph") == "X":
            out["waits"].append((args.get("task"), sec(e["ts"]), sec(e["ts"] + e["dur"]),
                                 bool(args.get("blocked"))))
        elif e.get("cat") == "chunk" and e.get("ph") == "X" and e["name"].startswith("allreduce "):
            out["allreduces"].append((e["name"][len("allreduce "):], args.get("priority"),
                                      sec(e["ts"]), sec(e["ts"] + e["dur"])))
        elif e.get("tid") == "overlap apply":
            out["applies"].append((args.get("task"), sec(e["ts"])))
    return out


def task_rows(tasks, max_rows: int = 16) -> dict:
    """Rows for the waits of ``tasks`` (task numbers, backprop order: the input
    side is the highest): one row per task, or -- for models with more tasks
    than ``max_rows`` (MobileNetV2 has > 100) -- runs of consecutive tasks
    sharing a row, input side first. Returns ``{task: (row, label)}``."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows!r}")
    ts = sorted(set(tasks), reverse=True)
    per = -(-len(ts) // max_rows) if ts else 1
    out = {}
    for i in range(0, len(ts), per):
        run = ts[i:i + per]
        label = f"task {run[0]}" if len(run) == 1 else f"tasks {run[-1]}-{run[0]}"
        if i == 0:
            label += " (input side)"
        for t in run:
            out[t] = (i // per, "wait, " + label)
    return out


def plot_overlap(trace: Path, out: Path, first_step: int = 8, nsteps: int = 2,
                 max_task_rows: int = 16) -> Path:
    """A PNG of :func:`overlap_timeline`: one row per chunk's allreduce (input
    side -- highest priority -- on top), the training calls and the per-layer
    waits of the next forward below (at most ``max_task_rows`` rows of them,
    see :func:`task_rows`)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = overlap_timeline(trace_events(Path(trace)), first_step, nsteps)
    chunks = sorted({(p, n) for n, p, _, _ in tl["allreduces"]}, key=lambda x: (-x[0], x[1]))
    rows = {c: i for i, c in enumerate(chunks)}
    trows = task_rows([t for t, *_ in tl["waits"]], max_task_rows)
    ntrows = len({r for r, _ in trows.values()})
    fig, ax = plt.subplots(figsize=(11, 0.35 * (len(rows) + ntrows + 2) + 1.5))
    cmap = plt.get_cmap("viridis")
    top = max((p for p, _ in chunks), default=1) or 1
    for name, prio, a, b in tl["allreduces"]:
        ax.barh(rows[(prio, name)], b - a, left=a, color=cmap(prio / top), edgecolor="black",
                linewidth=0.3)
    base = len(rows)
    for a, b in tl["calls"]:
        ax.barh(base, b - a, left=a, color="tab:gray")
    for task, a, b, blocked in tl["waits"]:
        y = base + 1 + trows[task][0]
        ax.barh(y, max(b - a, 0.002), left=a, color="tab:red" if blocked else "tab:green")
    for task, t in tl["applies"]:
        if task in trows:
            ax.plot([t], [base + 1 + trows[task][0]], marker="|", color="black", markersize=12)
    labels = [f"allreduce {n} (prio {p})" for p, n in chunks] + ["training call"] + \
        [lab for _, lab in sorted(set(trows.values()))]
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the start of a training call")
    ax.set_title("hvd.overlap: the next call's forward waits per layer (task in backprop order; "
                 "red = blocked, | = layer updated)\nwhile this step's chunks are reduced "
                 "(colour = priority; the input side ranks highest)", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser(prog="python -m benchmarks.traces",
                                description="plot a barrier-crossing timeline from a trace")
    p.add_argument("trace", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--first-step", type=int, default=8)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--max-task-rows", type=int, default=16,
                   help="rows of layer waits at most (consecutive tasks share a row)")
    a = p.parse_args()
    print(plot_overlap(a.trace, a.out, a.first_step, a.steps, a.max_task_rows))
