"""``horovod-prio arbiter``: run the link arbiter, or print its stats.

    horovod-prio arbiter --bind HOST:PORT [--secret-file F] [--credit-bytes N]
                         [--link-credit LINK=N ...] [--lease-seconds S]
                         [--starvation-bound K] [--order burst|chunk]
                         [--class-reserve F]
                         [--handshake-timeout S] [--max-connections N]
                         [--max-handshakes N] [--log-level LEVEL]
                         [--cpu LIST] [--priority realtime[=N]|nice=N]
    horovod-prio arbiter --stats HOST:PORT [--secret-file F]

The secret comes from ``--secret-file`` (whole file, surrounding whitespace
stripped) or else the environment variable ``HOROVOD_PRIO_ARBITER_SECRET``.
Byte sizes, counts and seconds are read by :mod:`horovod_prio.method.units`,
the parsers of the ``HOROVOD_PRIO_*`` variables (``16MiB``, ``1.5MiB``,
``1MB`` = 10^6 bytes; a bad value exits 2 naming the option and the rule).

``--cpu`` and ``--priority`` place the service on the machine (its loop
thread inherits both): they are applied before it binds, and a placement the
operating system refuses exits 1 naming the option and what would permit it.
"""
import argparse
import json
import logging
import os
import signal
import sys

from horovod_prio.method import units

from . import placement
from . import protocol as P
from .core import DEFAULT_CLASS_RESERVE, Arbiter
from .placement import PlacementError  # noqa: F401 (the CLI's error, re-exported)

SECRET_ENV = "HOROVOD_PRIO_ARBITER_SECRET"

# the project's parsers, as for the HOROVOD_PRIO_* variables
_bytes = units.arg(units.parse_bytes, 1)
_seconds = units.arg(units.parse_float, 0, strict=True, unit=" seconds")
_count = units.arg(units.parse_int, 0)
_positive_count = units.arg(units.parse_int, 1)


def _link_credit(text):
    name, sep, val = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError("expected LINK=BYTES, got %r" % text)
    return name, _bytes(val)


def parse_cpus(text):
    """``--cpu``: ``"3"``, ``"0,2"``, ``"0-3"`` (or a mix) -> frozenset of CPU numbers."""
    out = set()
    for part in str(text).split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            lo = int(lo)
            hi = int(hi) if sep else lo
        except ValueError:
            raise argparse.ArgumentTypeError(
                "expected CPU numbers such as 3, 0,2 or 0-3, got %r" % text) from None
        if lo < 0 or hi < lo:
            raise argparse.ArgumentTypeError(
                "expected CPU numbers >= 0 and ranges LOW-HIGH with LOW <= HIGH, got %r" % text)
        out.update(range(lo, hi + 1))
    return frozenset(out)


REALTIME_DEFAULT = units.REALTIME_DEFAULT
# ``--priority``: ``realtime`` (SCHED_FIFO at priority 10), ``realtime=N`` (N in
# 1..99) or ``nice=N`` (N in -20..19) -> ``(kind, N)``
parse_priority = units.arg(units.parse_sched_priority)


def apply_placement(cpus=None, priority=None):
    """Pin the calling thread to ``cpus`` and give it ``priority`` (from
    :func:`parse_cpus` / :func:`parse_priority`); threads it starts later
    inherit both. Returns what was applied, as a sentence; raises
    :class:`PlacementError` when the system refuses."""
    done = []
    if cpus:
        done.append(placement.apply_cpus(cpus, "--cpu %s" % placement.cpu_list(cpus)))
    if priority is not None:
        done.append(placement.apply_priority(priority,
                                             "--priority %s" % placement.spelled(priority)))
    return "; ".join(done)


def build_parser():
    p = argparse.ArgumentParser(prog="horovod-prio arbiter",
                                description="Cross-job link arbiter for jobs sharing a bottleneck link.")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--bind", metavar="HOST:PORT", help="serve on this address (port 0 = any free port)")
    mode.add_argument("--stats", metavar="HOST:PORT", help="print a running arbiter's counters as JSON")
    p.add_argument("--secret-file", metavar="F",
                   help="file holding the shared secret (default: env %s)" % SECRET_ENV)
    p.add_argument("--credit-bytes", type=_bytes, default=8 << 20, metavar="N",
                   help="granted-but-unfinished bytes allowed per link (default 8MiB: two "
                        "chunks of the default partition, so a priority class or a boost "
                        "preempts within one chunk; about 5-7 ms of the link's rate serves "
                        "best, e.g. 16MiB for 25 Gbit/s: docs/sim.md)")
    p.add_argument("--link-credit", type=_link_credit, action="append", default=[], metavar="LINK=N",
                   help="credit for one link (repeatable)")
    p.add_argument("--lease-seconds", type=_seconds, default=10.0, metavar="S",
                   help="a grant not completed within S seconds expires (default 10)")
    p.add_argument("--starvation-bound", type=_count, default=8, metavar="K",
                   help="a request passed over K times is granted next (default 8; 0 = off)")
    p.add_argument("--order", choices=Arbiter.ORDERS, default="burst",
                   help="cross-job order: 'burst' = by the priority of the job's current burst "
                        "(its step's chunks: the highest priority it requested), bursts in start "
                        "order, then the request's own priority; 'chunk' = each request by its "
                        "own priority, ties in arrival order (default burst)")
    p.add_argument("--class-reserve", type=units.arg(units.parse_class_reserve),
                   default=DEFAULT_CLASS_RESERVE, metavar="F",
                   help="share of each link's credit the lower job classes leave free while a "
                        "job of a higher class is connected, so its next step's first chunks "
                        "are granted at once (default %g; 0 = off; no effect with one class)"
                        % DEFAULT_CLASS_RESERVE)
    p.add_argument("--handshake-timeout", type=_seconds, default=2.0, metavar="S",
                   help="a connection not authenticated within S seconds is closed (default 2)")
    p.add_argument("--max-connections", type=_positive_count, default=1024, metavar="N",
                   help="authenticated connections (jobs, --stats) at most (default 1024)")
    p.add_argument("--max-handshakes", type=_positive_count, default=64, metavar="N",
                   help="connections still in the handshake at most (default 64)")
    p.add_argument("--cpu", type=parse_cpus, metavar="LIST",
                   help="pin the arbiter to these CPUs (e.g. 3, 2,3 or 2-3); best a CPU the "
                        "jobs' busy threads do not use")
    p.add_argument("--priority", type=parse_priority, metavar="realtime[=N]|nice=N",
                   help="scheduling priority of the arbiter: realtime = SCHED_FIFO (priority N, "
                        "1..99, default %d; needs root or CAP_SYS_NICE), nice=N (-20..19; below "
                        "the current value needs the same). A busy machine then wakes the "
                        "arbiter first; default: unchanged" % REALTIME_DEFAULT)
    p.add_argument("--timeout", type=_seconds, default=2.0, help="--stats: seconds to wait (default 2)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "debug", "info", "warning", "error"])
    return p


def _secret(args):
    if args.secret_file:
        try:
            return P.read_secret_file(args.secret_file, "--secret-file")
        except ValueError as e:
            raise SystemExit("horovod-prio arbiter: %s" % e)
    s = os.environ.get(SECRET_ENV, "").strip()
    if not s:
        raise SystemExit("horovod-prio arbiter: no shared secret: pass --secret-file F or set %s"
                         % SECRET_ENV)
    return s.encode("utf-8")


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .client import fetch_stats, parse_address
    try:
        secret = _secret(args)
        addr = parse_address(args.stats or args.bind) if (args.stats or not args.bind.endswith(":0")) \
            else (args.bind.rpartition(":")[0].strip("[]"), 0)
    except ValueError as e:
        print("horovod-prio arbiter: %s" % e, file=sys.stderr)
        return 2
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    if args.stats:
        try:
            stats = fetch_stats(addr, secret, timeout=args.timeout)
        except Exception as e:
            print("horovod-prio arbiter: stats from %s:%d failed: %s" % (addr[0], addr[1], e),
                  file=sys.stderr)
            return 1
        print(json.dumps(stats, indent=2, sort_keys=True))
        return 0

    if args.cpu or args.priority:
        try:
            placed = apply_placement(args.cpu, args.priority)   # the loop thread inherits it
        except PlacementError as e:
            print("horovod-prio arbiter: %s" % e, file=sys.stderr)
            return 1
        logging.getLogger("horovod_prio.arbiter").info("arbiter: %s", placed)

    from .server import ArbiterServer
    srv = ArbiterServer(addr[0], addr[1], secret, credit_bytes=args.credit_bytes,
                        lease_seconds=args.lease_seconds, starvation_bound=args.starvation_bound,
                        link_credits=dict(args.link_credit), order=args.order,
                        class_reserve=args.class_reserve,
                        handshake_timeout=args.handshake_timeout,
                        max_connections=args.max_connections, max_handshakes=args.max_handshakes)
    done = []
    import threading
    ev = threading.Event()

    def _stop(signum, frame):
        done.append(signum)
        ev.set()

    # before "listening" is printed: a SIGTERM right after it stops the arbiter cleanly
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        host, port = srv.start()
    except OSError as e:
        print("horovod-prio arbiter: cannot bind %s:%d: %s" % (addr[0], addr[1], e), file=sys.stderr)
        return 1
    print("horovod-prio arbiter listening on %s:%d" % (host, port), flush=True)
    while not ev.is_set() and srv.is_alive():
        ev.wait(0.5)
    srv.stop()
    return 0 if done else 1
