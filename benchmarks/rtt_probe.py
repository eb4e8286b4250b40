"""Per-stage timing of one grant round trip, for ``benchmarks/arbiter_rtt.py --profile``.

No change to the protocol or to the arbiter's code: the probes wrap, in the
benchmark's own processes only, the functions a grant passes through and take
``time.perf_counter_ns()`` (CLOCK_MONOTONIC on Linux, one clock for every
process of the machine) at each step. A round trip is then the chain

    client caller thread   t0 (request() called) .. c_sealed (REQUEST MACed, before send())
    server loop            s_wake (select() returned) .. s_start (this connection's turn)
                           .. s_read (recv + framing) .. s_open (MAC verified)
                           .. s_core (policy decided) .. s_sealed (GRANT MACed, before send())
    client I/O thread      c_wake (select() returned) .. c_read (recv + framing)
                           .. c_open (MAC verified) .. c_deliver (on_grant called)

and consecutive differences are the stages (:data:`STAGES`); they add up to
the round trip exactly. The two ``send()`` system calls are timed on their own
too (``c_send``, ``s_send``): on loopback the sender's ``send()`` runs the TCP
receive path and wakes the receiver, so it overlaps the next stage and is
reported beside the chain, not in it. The probes cost a few microseconds per
grant (a Python call each); ``--profile`` reports its own round trip so it can
be compared with an unprobed run.
"""
import json
import os
import signal
import sys
import threading
import time

_now = time.perf_counter_ns

# (name, from, to): consecutive points of the chain above
STAGES = (
    ("client: request() -> REQUEST sealed (caller thread)", "t0", "c_sealed"),
    ("client send() + kernel + server wake-up", "c_sealed", "s_wake"),
    ("server: other connections first (same wake-up)", "s_wake", "s_start"),
    ("server: recv + framing", "s_start", "s_read"),
    ("server: MAC verify", "s_read", "s_open"),
    ("server: decode + policy (core)", "s_open", "s_core"),
    ("server: GRANT sealed", "s_core", "s_sealed"),
    ("server send() + kernel + client I/O-thread wake-up", "s_sealed", "c_wake"),
    ("client: recv + framing (I/O thread)", "c_wake", "c_read"),
    ("client: MAC verify", "c_read", "c_open"),
    ("client: state machine -> on_grant", "c_open", "c_deliver"),
)
# timed on their own (they overlap the stage after them)
SYSCALLS = (("client send() syscall (caller thread)", "c_sealed", "c_sent"),
            ("server send() syscall", "s_sealed", "s_sent"))

_T_REQUEST, _T_GRANT = 0x02, 0x82


def _token(payload):
    return int.from_bytes(payload[1:9], "big")


# ---------------------------------------------------------------- client side

class ClientProbe:
    """Installed in one job process, around one ``ArbiterClient``. ``records``
    maps a request key to its client-side points."""

    def __init__(self):
        self.records = {}
        self._sending = None        # record of the REQUEST being sealed/sent (caller, under the lock)
        self._wake = 0
        self._read = 0

    def install(self, client_mod, cl):
        from horovod_prio.arbiter import protocol as P
        from horovod_prio.arbiter import transport as T
        probe = self
        sel = cl._sel
        orig_select = sel.select

        def select(timeout=None):
            r = orig_select(timeout)
            probe._wake = _now()
            return r
        sel.select = select

        orig_read, orig_write = T.Transport.read, T.Transport.write
        orig_seal, orig_open = P.Session.seal, P.Session.open

        def read(t):
            r = orig_read(t)
            probe._read = _now()
            return r

        def write(t, data):
            rec = probe._sending
            if rec is None:
                return orig_write(t, data)
            probe._sending = None
            orig_write(t, data)
            rec["c_sent"] = _now()

        def seal(s, payload):
            r = orig_seal(s, payload)
            if payload[0] == _T_REQUEST:
                rec = probe.records.setdefault(_token(payload), {})
                rec["c_sealed"] = _now()
                probe._sending = rec
            return r

        def open_(s, body):
            p = orig_open(s, body)
            if p[0] == _T_GRANT:
                t = _now()
                rec = probe.records.setdefault(_token(p), {})
                rec["c_wake"], rec["c_read"], rec["c_open"] = probe._wake, probe._read, t
            return p
        T.Transport.read, T.Transport.write = read, write
        P.Session.seal, P.Session.open = seal, open_

    def mark(self, key, name, t):
        self.records.setdefault(key, {})[name] = t


# ---------------------------------------------------------------- server side

class ServerProbe:
    """Installed in the arbiter's process. ``records`` maps ``(job_id, token)``
    to the server-side points of that REQUEST."""

    def __init__(self):
        self.records = {}
        self._wake = self._start = self._read = self._open = 0
        self._cur = None

    def install(self, srv):
        from horovod_prio.arbiter import core as C
        from horovod_prio.arbiter import protocol as P
        from horovod_prio.arbiter import server as S
        from horovod_prio.arbiter import transport as T
        probe = self
        # the loop's poll (a checkout from before the epoll loop: its selector's select)
        owner, name = (srv, "_poll") if hasattr(srv, "_poll") else (srv.sel, "select")
        orig_poll = getattr(owner, name)

        def poll(timeout=None):
            r = orig_poll(timeout)
            probe._wake = _now()
            return r
        setattr(owner, name, poll)
        orig_on_readable = S._Conn.on_readable
        orig_read, orig_write = T.Transport.read, T.Transport.write
        orig_seal, orig_open = P.Session.seal, P.Session.open
        orig_request = C.Arbiter.request

        def on_readable(conn):
            probe._start = _now()
            return orig_on_readable(conn)

        def read(t):
            r = orig_read(t)
            probe._read = _now()
            return r

        def open_(s, body):
            p = orig_open(s, body)
            probe._open = _now()
            return p

        def request(arb, job, token, *a, **k):
            rec = {"s_wake": probe._wake, "s_start": probe._start, "s_read": probe._read,
                   "s_open": probe._open}
            r = orig_request(arb, job, token, *a, **k)
            rec["s_core"] = _now()
            probe.records[(job.job_id, token)] = rec
            probe._cur = (token, rec)
            return r

        def seal(s, payload):
            r = orig_seal(s, payload)
            cur = probe._cur
            if cur is not None and payload[0] == _T_GRANT and _token(payload) == cur[0]:
                cur[1]["s_sealed"] = _now()
                probe._cur = (None, cur[1])     # the next write() is this GRANT
            return r

        def write(t, data):
            cur = probe._cur
            if cur is None or cur[0] is not None:
                return orig_write(t, data)
            probe._cur = None
            orig_write(t, data)
            cur[1]["s_sent"] = _now()
        S._Conn.on_readable = on_readable
        T.Transport.read, T.Transport.write = read, write
        P.Session.seal, P.Session.open = seal, open_
        C.Arbiter.request = request


def serve(out_path, credit_bytes=1 << 30):
    """The arbiter as ``horovod-prio arbiter`` runs it (server thread + waiting main
    thread), with a :class:`ServerProbe`; on SIGTERM the records go to ``out_path``
    as JSON (``[[job_id, token, {point: ns}], ...]``)."""
    import logging
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from horovod_prio.arbiter.server import ArbiterServer
    srv = ArbiterServer("127.0.0.1", 0, os.environ["HOROVOD_PRIO_ARBITER_SECRET"],
                        credit_bytes=credit_bytes)
    host, port = srv.start()
    probe = ServerProbe()
    srv.call(probe.install, srv)
    print("horovod-prio arbiter listening on %s:%d" % (host, port), flush=True)
    ev = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: ev.set())
    signal.signal(signal.SIGINT, lambda *_: ev.set())
    while not ev.is_set() and srv.is_alive():
        ev.wait(0.5)
    srv.stop()
    with open(out_path, "w") as f:
        json.dump([[j, t, r] for (j, t), r in probe.records.items()], f)
    return 0


# ---------------------------------------------------------------- analysis

def _pct(sorted_vals, p):
    k = min(len(sorted_vals) - 1, max(0, int(round(p / 100.0 * (len(sorted_vals) - 1)))))
    return sorted_vals[k]


def breakdown(samples, tail_pct=99.0):
    """``samples``: one dict of points per round trip (client and, when the
    server was probed, server points merged). Returns, per stage present in
    every sample, p50/p99/mean (µs), the mean over the round trips at or above
    the ``tail_pct`` percentile of the round trip (what the slow ones spend
    where), and the same for the send() syscalls."""
    samples = [s for s in samples if "t0" in s and "c_deliver" in s]
    if not samples:
        return {}
    points = [p for _, a, b in STAGES for p in (a, b)]
    chain = [p for p in dict.fromkeys(points) if all(p in s for s in samples)]
    stages = []
    for a, b in zip(chain, chain[1:]):
        name = next((n for n, x, y in STAGES if x == a and y == b), None)
        if name is None:        # points missing in between (server not probed): one stage
            name = "%s -> %s (not probed in between)" % (a, b)
        stages.append((name, a, b))
    rtt = [s["c_deliver"] - s["t0"] for s in samples]
    # the slowest (100 - tail_pct) % of the round trips, at least one
    k = max(1, int(round(len(samples) * (100.0 - tail_pct) / 100.0)))
    order = sorted(range(len(samples)), key=rtt.__getitem__, reverse=True)[:k]
    tail = [samples[i] for i in order]
    tail_rtt = [rtt[i] for i in order]
    us = lambda ns: round(ns / 1000.0, 1)  # noqa: E731

    def row(name, a, b):
        d = sorted(s[b] - s[a] for s in samples if a in s and b in s)
        dt = [s[b] - s[a] for s in tail if a in s and b in s]
        if not d:
            return None
        return {"stage": name, "p50_us": us(_pct(d, 50)), "p99_us": us(_pct(d, 99)),
                "mean_us": us(sum(d) / len(d)),
                "tail_mean_us": us(sum(dt) / len(dt)) if dt else None}
    srt = sorted(rtt)
    out = {"round_trips": len(samples), "tail_pct": tail_pct, "tail_round_trips": len(tail),
           "rtt_p50_us": us(_pct(srt, 50)), "rtt_p99_us": us(_pct(srt, 99)),
           "tail_rtt_mean_us": us(sum(tail_rtt) / len(tail)),
           "stages": [r for r in (row(*st) for st in stages) if r],
           "syscalls": [r for r in (row(*st) for st in SYSCALLS) if r]}
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        sys.exit(serve(sys.argv[2]))
    print("usage: python -m benchmarks.rtt_probe serve OUT.json", file=sys.stderr)
    sys.exit(2)
