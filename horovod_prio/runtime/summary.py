"""What a training run did, for people: per monitor the steps and their times,
the boost and its changes; the scheduler's chunk counters; the arbiter link's
waits. No TensorFlow (the Keras callback that prints it and writes the
TensorBoard scalars is in ``horovod_prio.tensorflow.keras.callbacks``).

Only rank 0 times steps and decides priorities (it alone holds chunks and
talks to the arbiter), so a summary is rank 0's; elsewhere it holds the
chunk counters only.
"""

from horovod_prio.scheduler import UNLIMITED

__all__ = ["summary", "format_summary"]

SCHEDULER_KEYS = ("submitted", "released", "completed", "abandoned", "cancelled",
                  "max_inflight_bytes", "credit_bytes")


def summary(runtime, wait=1.0):
    """A dict of the run so far (steps finished by now are counted first)."""
    if runtime.clock is not None and runtime.monitors:
        runtime.pump(wait=wait)
    out = {"rank": runtime.rank, "monitors": [], "scheduler": None, "arbiter": None}
    for m in list(runtime.monitors):
        out["monitors"].append({
            "name": m.name, "steps": m.steps,
            "mean_s": m.total_seconds / m.steps if m.steps else None,
            "min_s": m.min_seconds, "max_s": m.max_seconds,
            "boost": m._last_boost, "boost_raises": m.raises, "boost_decays": m.decays})
    if runtime.scheduler is not None:
        stats = runtime.scheduler.stats()
        out["scheduler"] = {k: stats[k] for k in SCHEDULER_KEYS}
    link = runtime.arbiter
    if link is not None:
        c = link.client.counters()
        out["arbiter"] = {"address": link.address, "link": link.link,
                          "grants": c.get("grants"), "fallback_grants": c.get("fallback_grants"),
                          "wait_s_total": c.get("wait_seconds_total"),
                          "wait_s_max": c.get("wait_seconds_max"), "outages": c.get("outages")}
    return out


def _s(x):
    return "-" if x is None else "%.3fs" % x


def format_summary(s, overlap=None):
    """A few lines for the end of ``fit`` (``overlap``: ``{name: channel stats}``)."""
    lines = []
    for m in s["monitors"]:
        lines.append("horovod_prio: %s: %d steps, step time mean %s (min %s, max %s); boost %d "
                     "(raised %d, lowered %d times)" % (
                         m["name"], m["steps"], _s(m["mean_s"]), _s(m["min_s"]), _s(m["max_s"]),
                         m["boost"], m["boost_raises"], m["boost_decays"]))
    sc = s["scheduler"]
    if sc is not None:
        lines.append("horovod_prio: chunks submitted %d, released %d, completed %d, abandoned %d; "
                     "at most %d B in flight (credit %s)" % (
                         sc["submitted"], sc["released"], sc["completed"], sc["abandoned"],
                         sc["max_inflight_bytes"],
                         "none" if sc["credit_bytes"] == UNLIMITED else "%d B" % sc["credit_bytes"]))
    for name, st in sorted((overlap or {}).items()):
        lines.append("horovod_prio: %s overlap: %d steps in the background, %d layer waits "
                     "(%d blocked)" % (name, st.get("finished", 0), st.get("waits", 0),
                                       st.get("waits_blocked", 0)))
    a = s["arbiter"]
    if a is not None:
        lines.append("horovod_prio: arbiter %s link %s: %s grants (%s local), grant waits %s "
                     "total, %s max, %s outages" % (
                         a["address"], a["link"], a["grants"], a["fallback_grants"],
                         _s(a["wait_s_total"]), _s(a["wait_s_max"]), a["outages"]))
    return "\n".join(lines)
