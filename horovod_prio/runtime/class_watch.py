"""Every rank's watch of its link's job classes (``class_auto``). No TensorFlow.

Only a holding rank talks to the arbiter about chunks, but the CPU a
lower-class job should give up is every rank's. So each process whose config
names an arbiter (and has ``class_auto`` on and no explicit ``cpu_nice``)
runs one :class:`ClassWatcher`: a thread with its own connection to the
arbiter that asks whether a job of a higher class than this job's is
connected to the job's link, and calls ``on_change(higher)`` whenever the
answer changes (:class:`~horovod_prio.runtime.cpu.LowerClassNice` nices the
process while it is true).

The connection (protocol in :mod:`horovod_prio.arbiter.protocol`): the
handshake, a PING with the nonce ``PROBE``; an arbiter that answers
FEATURES with the class-state bit before the PONG gets a WATCH (link,
class) and then sends CLASS_STATE now and on every change. An arbiter
without the feature (an older one) answers the PONG only: the watcher says
so once and stops; nothing changes for the job. The watcher pings every
``interval`` seconds; no frame for ``3 x interval`` (a hung or unreachable
arbiter), a closed connection or a bad frame ends the session: if the last
answer was "higher", ``on_change(False)`` first (a job never stays niced for
an arbiter it cannot hear), then it connects again after a back-off
(doubling up to ``backoff_max``). Nothing here ever blocks or fails the
job: its errors are logged (an outage at INFO: the job's own client warns).
"""
import logging
import socket
import threading
import time

from horovod_prio.arbiter import protocol as P
from horovod_prio.arbiter.transport import parse_address

__all__ = ["ClassWatcher", "watcher_from_config"]

log = logging.getLogger("horovod_prio")


class _Closed(Exception):
    pass


class ClassWatcher:
    """See the module docstring. ``start()``, ``close()``; ``higher`` (the last
    answer, False while not connected), ``supported`` (None until an arbiter
    answered the probe), ``sessions`` (watch sessions started)."""

    def __init__(self, address, secret, link, job_class, on_change, interval=1.0,
                 connect_timeout=2.0, backoff_initial=0.5, backoff_max=10.0):
        self.host, self.port = parse_address(address)
        self.secret = P.load_secret(secret, "class watcher")
        self.link, self.job_class = link, int(job_class)
        self.on_change = on_change
        self.interval = float(interval)
        self.connect_timeout = float(connect_timeout)
        self.backoff_initial, self.backoff_max = float(backoff_initial), float(backoff_max)
        self.higher = False
        self.supported = None
        self.sessions = 0
        self._stop = threading.Event()
        self._sock = None
        self._lock = threading.Lock()
        self._thread = None
        self._outage_logged = False

    def start(self):
        self._thread = threading.Thread(target=self._run, name="horovod_prio-class-watch",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self, timeout=5.0):
        self._stop.set()
        with self._lock:
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # ------------------------------------------------------------------ the thread
    def _set(self, higher):
        if higher != self.higher:
            self.higher = higher
            try:
                self.on_change(higher)
            except Exception:
                log.exception("horovod_prio: class watcher: applying class state %s failed",
                              higher)

    def _run(self):
        backoff = self.backoff_initial
        while not self._stop.is_set():
            try:
                if self._session():
                    return              # the arbiter has no class state: nothing to watch
                backoff = self.backoff_initial
            except (OSError, P.ProtocolError, _Closed, ValueError) as e:
                if not self._stop.is_set() and not self._outage_logged:
                    self._outage_logged = True
                    # INFO: the job's own client (rank 0) warns about the outage
                    log.info("horovod_prio: class watcher: arbiter %s:%d unreachable (%s); "
                             "the job runs at its own CPU priority until it answers",
                             self.host, self.port, e)
            except Exception:
                log.exception("horovod_prio: class watcher failed (retrying)")
            finally:
                with self._lock:
                    sock, self._sock = self._sock, None
                if sock is not None:
                    sock.close()
                self._set(False)
            if self._stop.wait(backoff):
                return
            backoff = min(self.backoff_max, backoff * 2)

    def _session(self):
        """One connection. True when the arbiter has no class state (stop)."""
        sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        with self._lock:
            self._sock = sock
        if self._stop.is_set():
            raise _Closed("closed")
        reader = P.FrameReader(P.MAX_FRAME)
        backlog = []
        deadline = [time.monotonic() + self.connect_timeout]

        def next_body():
            while not backlog:
                left = deadline[0] - time.monotonic()
                if left <= 0:
                    raise _Closed("no answer within %.1f s" % (deadline[0] - started))
                sock.settimeout(min(left, self.interval))
                try:
                    data = sock.recv(65536)
                except socket.timeout:
                    return None
                if not data:
                    raise _Closed("connection closed")
                backlog.extend(reader.feed(data))
            return backlog.pop(0)

        started = time.monotonic()
        hs = P.ClientHandshake(self.secret)
        sock.sendall(hs.hello())
        body = None
        while body is None:
            body = next_body()
        proof = hs.on_challenge(body)
        s = hs.session
        sock.sendall(proof + s.seal(P.enc_token(P.T_PING, P.PROBE)))
        body = None
        while body is None:
            body = next_body()
        hs.on_verdict(body)
        features = 0
        while True:                     # FEATURES (a newer arbiter), then the PONG
            body = next_body()
            if body is None:
                continue
            p = s.open(body)
            if p[0] == P.T_FEATURES:
                features = P.dec_features(p)
            elif p[0] == P.T_PONG and P.dec_token(p) == P.PROBE:
                break
            else:
                raise P.ProtocolError("unexpected frame 0x%02x before the probe's PONG" % p[0])
        self.supported = bool(features & P.F_CLASS_STATE)
        if not self.supported:
            log.info("horovod_prio: the arbiter at %s:%d does not report job classes (an older "
                     "version): the job keeps its CPU priority beside higher classes",
                     self.host, self.port)
            return True
        sock.sendall(s.seal(P.enc_watch(self.link, self.job_class)))
        self.sessions += 1
        if self._outage_logged:
            log.info("horovod_prio: class watcher: arbiter %s:%d answers again", self.host,
                     self.port)
            self._outage_logged = False
        nonce = 0
        silent_for = 3 * self.interval
        deadline[0] = time.monotonic() + silent_for
        next_ping = time.monotonic() + self.interval
        while not self._stop.is_set():
            body = next_body()
            now = time.monotonic()
            if body is not None:
                deadline[0] = now + silent_for      # the arbiter is alive
                p = s.open(body)
                if p[0] == P.T_CLASS_STATE:
                    self._set(P.dec_class_state(p))
                elif p[0] == P.T_ERROR:
                    raise P.ProtocolError("arbiter: %s" % p[1:].decode("utf-8", "replace"))
                elif p[0] != P.T_PONG:
                    raise P.ProtocolError("unexpected frame 0x%02x" % p[0])
            if now >= next_ping:
                nonce += 1
                sock.sendall(s.seal(P.enc_token(P.T_PING, nonce)))
                next_ping = now + self.interval
        raise _Closed("closed")


def watcher_from_config(config, on_change, **kwargs):
    """A started :class:`ClassWatcher` for ``config``'s arbiter, link and class,
    or None when the job has no arbiter or turned ``class_auto`` off."""
    if not (config.arbiter and config.link and config.class_auto):
        return None
    return ClassWatcher(config.arbiter, P.config_secret(config), config.link,
                        config.job_priority or 0, on_change, **kwargs).start()
