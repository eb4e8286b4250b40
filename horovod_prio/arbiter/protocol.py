"""Wire protocol of the link arbiter: length-prefixed binary frames over TCP.

Pure Python (stdlib only). Shared by :mod:`.server` and :mod:`.client`.

Framing
-------
Every frame is ``u32 length`` (big endian, of what follows) + body. A length
of 0 or above :data:`MAX_FRAME` is a protocol error (the peer is dropped).

Handshake (bodies not MACed; mutual HMAC-SHA256 challenge-response)::

    C->S  HELLO      b"HPA1" + client_nonce[32]
    S->C  CHALLENGE  b"HPA1" + server_nonce[32] + HMAC(secret, b"srv" + cn + sn)
    C->S  PROOF      HMAC(secret, b"cli" + cn + sn)

Both sides then derive ``session_key = HMAC(secret, b"key" + cn + sn)``.
Every later body is ``payload + MAC`` with
``MAC = HMAC-SHA256(session_key, direction + seq.to_bytes(8) + payload)``,
``direction`` b"C" (client to server) or b"S", and ``seq`` counting that
direction's frames from 0 (implicit, never sent): a forged, altered,
replayed, reordered or dropped frame fails its MAC.

Payloads (``type u8`` + fields, big endian)::

    C->S REGISTER  0x01  str16 job_id, str16 link          (once, first frame of a job)
    C->S REQUEST   0x02  u64 token, i64 priority, u64 nbytes, str16 chunk_id
    C->S COMPLETE  0x03  u64 token
    C->S PING      0x04  u64 nonce
    C->S STATS     0x05  -
    C->S CANCEL    0x06  u64 token   (client gave up waiting and granted locally)
    S->C REGISTERED 0x81 -
    S->C GRANT     0x82  u64 token
    S->C QUEUED    0x83  u64 token   (request accepted, waiting behind others)
    S->C PONG      0x84  u64 nonce
    S->C STATS_REPLY 0x85 utf-8 JSON
    S->C ERROR     0x86  utf-8 text (server closes after it)

``token`` is chosen by the client (unique per connection); ``str16`` is
``u16 length`` + UTF-8 bytes, at most :data:`MAX_NAME` bytes.
"""
import hmac
import os
import struct

MAGIC = b"HPA1"
NONCE_LEN = 32
MAC_LEN = 32
MAX_FRAME = 64 * 1024
MAX_NAME = 256

T_REGISTER = 0x01
T_REQUEST = 0x02
T_COMPLETE = 0x03
T_PING = 0x04
T_STATS = 0x05
T_CANCEL = 0x06
T_REGISTERED = 0x81
T_GRANT = 0x82
T_QUEUED = 0x83
T_PONG = 0x84
T_STATS_REPLY = 0x85
T_ERROR = 0x86

_LEN = struct.Struct(">I")
_U64 = struct.Struct(">BQ")
_REQ = struct.Struct(">BQqQH")
_U16 = struct.Struct(">H")

I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1
U64_MAX = (1 << 64) - 1


class ProtocolError(Exception):
    """A malformed, oversized or unauthenticated frame."""


def load_secret(secret):
    """Normalise a shared secret (str -> UTF-8; surrounding whitespace stripped,
    on both sides, so a file's trailing newline does not matter) to non-empty bytes."""
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    if isinstance(secret, (bytes, bytearray)):
        secret = bytes(secret).strip()
    if not isinstance(secret, (bytes, bytearray)) or not secret:
        raise ValueError("arbiter secret must be a non-empty str or bytes, got %r"
                         % (type(secret).__name__ if secret is not None else None,))
    return bytes(secret)


def new_nonce():
    return os.urandom(NONCE_LEN)


def _h(key, msg):
    return hmac.digest(key, msg, "sha256")


def server_proof(secret, cn, sn):
    return _h(secret, b"srv" + cn + sn)


def client_proof(secret, cn, sn):
    return _h(secret, b"cli" + cn + sn)


def session_key(secret, cn, sn):
    return _h(secret, b"key" + cn + sn)


def frame(body):
    """Length-prefix one body."""
    return _LEN.pack(len(body)) + body


class FrameReader:
    """Incremental splitter of a byte stream into frame bodies."""

    __slots__ = ("_buf", "max_frame")

    def __init__(self, max_frame=MAX_FRAME):
        self._buf = bytearray()
        self.max_frame = max_frame

    def feed(self, data):
        """Add bytes; return the list of complete bodies. Raises ProtocolError."""
        buf = self._buf
        if not buf and len(data) > 4:
            # fast path: exactly one whole frame (the common case)
            (length,) = _LEN.unpack_from(data, 0)
            if len(data) == 4 + length and 0 < length <= self.max_frame:
                return [data[4:]]
        buf += data
        out = []
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            (length,) = _LEN.unpack_from(buf, pos)
            if length == 0 or length > self.max_frame:
                raise ProtocolError("bad frame length %d (allowed 1..%d)" % (length, self.max_frame))
            if n - pos - 4 < length:
                break
            out.append(bytes(buf[pos + 4:pos + 4 + length]))
            pos += 4 + length
        if pos:
            del buf[:pos]
        return out

    @property
    def buffered(self):
        return len(self._buf)


class Session:
    """MACs outgoing payloads and verifies incoming ones for one connection."""

    __slots__ = ("_key", "_tx_dir", "_rx_dir", "_tx_seq", "_rx_seq")

    def __init__(self, key, is_server):
        self._key = key
        self._tx_dir = b"S" if is_server else b"C"
        self._rx_dir = b"C" if is_server else b"S"
        self._tx_seq = 0
        self._rx_seq = 0

    def seal(self, payload):
        """Return the framed ``payload + MAC`` (advances the send counter)."""
        mac = hmac.digest(self._key, self._tx_dir + self._tx_seq.to_bytes(8, "big") + payload, "sha256")
        self._tx_seq += 1
        body = payload + mac
        return _LEN.pack(len(body)) + body

    def open(self, body):
        """Verify one body and return its payload. Raises ProtocolError."""
        if len(body) <= MAC_LEN:
            raise ProtocolError("frame too short for a MAC (%d bytes)" % len(body))
        payload = body[:-MAC_LEN]
        mac = hmac.digest(self._key, self._rx_dir + self._rx_seq.to_bytes(8, "big") + payload, "sha256")
        if not hmac.compare_digest(mac, body[-MAC_LEN:]):
            raise ProtocolError("bad frame MAC (forged, altered or replayed frame)")
        self._rx_seq += 1
        return payload


# ---------------------------------------------------------------- encoders

def _str16(s):
    b = s.encode("utf-8")
    if len(b) > MAX_NAME:
        raise ValueError("name too long (%d bytes > %d): %r" % (len(b), MAX_NAME, s[:40]))
    return _U16.pack(len(b)) + b


def enc_register(job_id, link):
    return bytes([T_REGISTER]) + _str16(job_id) + _str16(link)


def enc_request(token, priority, nbytes, chunk_id):
    return _REQ.pack(T_REQUEST, token, priority, nbytes, 0)[:-2] + _str16(chunk_id)


def enc_token(kind, token):
    return _U64.pack(kind, token)


def enc_empty(kind):
    return bytes([kind])


def enc_text(kind, text):
    return bytes([kind]) + text.encode("utf-8")[:MAX_FRAME - 64]


# ---------------------------------------------------------------- decoders

def _read_str16(p, pos):
    if len(p) < pos + 2:
        raise ProtocolError("truncated string length")
    (n,) = _U16.unpack_from(p, pos)
    pos += 2
    if n > MAX_NAME:
        raise ProtocolError("string too long (%d > %d)" % (n, MAX_NAME))
    if len(p) < pos + n:
        raise ProtocolError("truncated string")
    try:
        s = p[pos:pos + n].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("string is not UTF-8") from None
    return s, pos + n


def dec_register(p):
    job, pos = _read_str16(p, 1)
    link, pos = _read_str16(p, pos)
    if pos != len(p):
        raise ProtocolError("trailing bytes in REGISTER")
    if not job or not link:
        raise ProtocolError("empty job id or link in REGISTER")
    return job, link


def dec_request(p):
    if len(p) < _REQ.size:
        raise ProtocolError("truncated REQUEST")
    _, token, priority, nbytes, _n = _REQ.unpack_from(p, 0)
    chunk, pos = _read_str16(p, _REQ.size - 2)
    if pos != len(p):
        raise ProtocolError("trailing bytes in REQUEST")
    return token, priority, nbytes, chunk


def dec_token(p):
    if len(p) != _U64.size:
        raise ProtocolError("bad length %d for a token frame" % len(p))
    return _U64.unpack(p)[1]
