"""``fetch_stats``: a blocking one-shot STATS exchange (``horovod-prio arbiter --stats``).

The reply is JSON of any size: the arbiter sends it in STATS_REPLY fragments
(each a normal frame, at most :data:`~.protocol.STATS_PART` bytes of JSON)
and this function joins them, so the counters stay readable at any number of
jobs and links.
"""
import json
import socket
import time

from . import protocol as P
from .transport import parse_address


class _Frames:
    def __init__(self, sock, deadline):
        self.sock, self.deadline = sock, deadline
        self.reader = P.FrameReader(P.MAX_FRAME)
        self.backlog = []

    def next(self):
        while not self.backlog:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("arbiter did not answer in time")
            self.sock.settimeout(remaining)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("arbiter closed the connection")
            self.backlog += self.reader.feed(data)
        return self.backlog.pop(0)


def fetch_stats(address, secret, timeout=2.0):
    """Connect, authenticate, return the arbiter's stats dict (blocking)."""
    host, port = parse_address(address)
    secret = P.load_secret(secret, "arbiter --stats")
    with socket.create_connection((host, port), timeout=timeout) as sock:
        frames = _Frames(sock, time.monotonic() + timeout)
        hs = P.ClientHandshake(secret)
        sock.sendall(hs.hello())
        proof = hs.on_challenge(frames.next())
        sock.sendall(proof + hs.session.seal(P.enc_empty(P.T_STATS)))
        hs.on_verdict(frames.next())
        parts, more = [], True
        while more:
            p = hs.session.open(frames.next())
            if p[0] != P.T_STATS_REPLY:
                raise P.ProtocolError("unexpected reply type 0x%02x" % p[0])
            more, data = P.dec_stats_part(p)
            parts.append(data)
        return json.loads(b"".join(parts).decode("utf-8"))
