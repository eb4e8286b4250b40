"""Background side of barrier crossing ("overlap", docs/overlap.md). No TensorFlow.

With overlap, a training call hands its gradient chunks to a *channel* and
returns; one :class:`OverlapWorker` thread per channel (= per overlapped
optimizer identity) runs the binding's ``step_fn`` once per posted step:
take the chunks, allreduce them, apply the update layer by layer, finish the
step. The runtime owns the workers: it starts them (first use) and, at exit,
flushes what was posted (bounded wait) and stops them.

A channel (duck-typed; the TensorFlow binding's is
``horovod_prio.tensorflow.overlapped.Channel``) has ``name``, ``state()``
(``"open"``, ``"closed"``, ``"failed"``), ``error()``, ``fail(message)``,
``flush(timeout) -> bool`` (True: everything posted is applied) and
``close()``.

:func:`trace_events` turns the channel's recorded events into Chrome-trace
events for the runtime's trace writer.
"""
import logging
import threading

__all__ = ["OverlapWorker", "trace_events"]

log = logging.getLogger("horovod_prio")


class OverlapWorker:
    """Runs ``step_fn()`` for every step posted to ``channel``, in order, on its own thread.

    ``step_fn`` blocks (without the GIL) until the next step posts, then takes,
    reduces and applies it. It raises once the channel is closed (normal end)
    or failed; any other exception fails the channel with its message, so the
    training side's waits and flushes raise it instead of hanging."""

    def __init__(self, name, channel, step_fn):
        self.name = name
        self.channel = channel
        self.step_fn = step_fn
        self.steps = 0
        self.error = None
        self._thread = None
        self._lock = threading.Lock()

    def start(self):
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="horovod_prio-overlap-%s" % self.name)
                self._thread.start()

    @property
    def alive(self):
        return self._thread is not None and self._thread.is_alive()

    def _run(self):
        while True:
            try:
                self.step_fn()
                self.steps += 1
            except BaseException as e:  # noqa: B902 - the thread must record, never die silently
                state = self.channel.state()
                if state == "closed":
                    return
                if state != "failed":
                    msg = "the background update of step %d failed: %s: %s" % (
                        self.steps + 1, type(e).__name__, _first_line(e))
                    self.channel.fail(msg)
                self.error = self.channel.error() or str(e)
                log.error("horovod_prio: overlap %s stopped: %s", self.name, self.error)
                return

    def stop(self, flush_timeout=30.0, join_timeout=5.0):
        """Flush what was posted (at most ``flush_timeout`` s), then close and
        join. Never raises (it runs at interpreter exit)."""
        try:
            if self.channel.state() == "open" and not self.channel.flush(flush_timeout):
                log.warning("horovod_prio: overlap %s: updates still pending after %g s at "
                            "exit were dropped (did another rank stop early?)", self.name,
                            flush_timeout)
        except Exception as e:  # a failed channel: already reported
            log.debug("horovod_prio: overlap %s: flush at exit: %s", self.name, e)
        try:
            self.channel.close()
        except Exception:
            log.debug("horovod_prio: overlap %s: close failed", self.name, exc_info=True)
        if self._thread is not None:
            self._thread.join(join_timeout)


def _first_line(e):
    text = str(e).strip()
    return text.splitlines()[0] if text else repr(e)


def trace_events(events, pid=0):
    """Chrome-trace events from channel events (dicts with ``kind``, ``channel``,
    ``ticket``, ``t_us`` and per kind ``task``/``begin_us``/``dur_us``/``slot``).

    * ``wait``: span ``wait layer <task>`` (tid ``overlap wait``) from the
      moment the next step's forward asked for the layer to the moment it got
      it (``args.blocked``: the previous step's update of that layer was still
      pending when it asked);
    * ``apply``: instant ``applied layer <task>`` (tid ``overlap apply``);
    * ``finish``: span ``update step <ticket>`` from the training call's
      begin to the background's last apply (tid ``overlap steps``);
    * everything else (begin, post, sealed, take_begin, drop, failed,
      closed): an instant on tid ``overlap``.
    Every event keeps the raw fields in ``args``."""
    out = []
    for e in events:
        kind, ts = e.get("kind"), e.get("t_us", 0)
        args = dict(e)
        if kind == "wait":
            begin, dur = e.get("begin_us", ts), e.get("dur_us", 0)
            out.append({"name": "wait layer %d" % e.get("task", -1), "ph": "X", "pid": pid,
                        "tid": "overlap wait", "ts": begin, "dur": max(0, dur),
                        "cat": "overlap", "args": args})
        elif kind == "apply":
            out.append({"name": "applied layer %d" % e.get("task", -1), "ph": "i", "s": "t",
                        "pid": pid, "tid": "overlap apply", "ts": ts, "cat": "overlap",
                        "args": args})
        elif kind == "finish":
            begin = e.get("begin_us", ts)
            out.append({"name": "update step %d" % e.get("ticket", 0), "ph": "X", "pid": pid,
                        "tid": "overlap steps", "ts": begin, "dur": max(0, ts - begin),
                        "cat": "overlap", "args": args})
        else:
            out.append({"name": "%s %s" % (kind, e.get("channel", "")), "ph": "i", "s": "t",
                        "pid": pid, "tid": "overlap", "ts": ts, "cat": "overlap",
                        "args": args})
    return out
