"""Wire protocol of the link arbiter: length-prefixed binary frames over TCP.

Pure Python (stdlib only). Shared by :mod:`.server`, :mod:`.client` and
:mod:`.stats`; they use it only through the functions and classes below.

Framing
-------
Every frame is ``u32 length`` (big endian, of what follows) + body. A length
of 0 or above :data:`MAX_FRAME` is a protocol error (the peer is dropped).

Handshake (protocol 2, magic ``HPA2``; bodies not MACed)::

    C->S  HELLO      MAGIC + client_nonce[32]
    S->C  CHALLENGE  MAGIC + server_nonce[32]                  nothing derived from the secret
    C->S  PROOF      HMAC(secret, "cli" + MAGIC + cn + sn)      the client proves first
    S->C  VERDICT    0x00 + HMAC(secret, "srv" + MAGIC + cn + sn)   proof accepted; the server proves
                     0x01                                      rejected; the server closes

The server answers with something derived from the secret only after the
client has proved that it knows it, so connecting to the arbiter gives no
offline guessing oracle; each wrong guess costs a connection (and is counted
in ``auth_failures``). Both sides derive
``session_key = HMAC(secret, "key" + MAGIC + cn + sn)``; the client may send
sealed frames right after its PROOF. Every later body is ``payload + MAC``
with ``MAC = HMAC-SHA256(session_key, direction + seq.to_bytes(8) + payload)``,
``direction`` b"C" (client to server) or b"S", and ``seq`` counting that
direction's frames from 0 (implicit, never sent): a forged, altered,
replayed, reordered or dropped frame fails its MAC.

Payloads (``type u8`` + fields, big endian)::

    C->S REGISTER  0x01  str16 job_id, str16 link, i32 job_class   (once, first frame of a job)
    C->S REQUEST   0x02  u64 token, i64 priority, u64 nbytes, str16 chunk_id [, u64 step]
    C->S COMPLETE  0x03  u64 token   (granted chunk finished)
    C->S PING      0x04  u64 nonce
    C->S STATS     0x05  -
    C->S CANCEL    0x06  u64 token   (withdrawn: pending -> dropped, granted -> released)
    C->S RENEW     0x07  u64 token   (the grant is still in use: restart its lease)
    C->S WATCH     0x08  str16 link, i32 job_class   (only after FEATURES said class state)
    S->C REGISTERED 0x81 u32 lease_ms
    S->C GRANT     0x82  u64 token
    S->C QUEUED    0x83  u64 token   (request accepted, waiting behind others)
    S->C PONG      0x84  u64 nonce
    S->C STATS_REPLY 0x85 u8 more, utf-8 JSON fragment (more=1: another fragment follows)
    S->C ERROR     0x86  utf-8 text (server closes after it)
    S->C FEATURES  0x87  u32 bits    (only before the PONG of a PING with nonce PROBE)
    S->C CLASS_STATE 0x88 u8 higher  (a WATCH's link has a class above its class connected: 1/0)

``token`` is chosen by the client (unique per connection); ``str16`` is
``u16 length`` + UTF-8 bytes, at most :data:`MAX_NAME` bytes. ``step``, the
job's training step the chunk belongs to (> 0; see the burst order in
:mod:`.core`), is optional: a REQUEST without it (a client that does not
know its steps) is untagged, as is step 0. An arbiter from before the field
drops a client that sends it (``trailing bytes in REQUEST``).

Features (class state). A client learns what the arbiter offers beyond the
frames above without risking its connection: it sends a PING whose nonce is
:data:`PROBE`. An arbiter that has features answers FEATURES (a bit set,
:data:`F_CLASS_STATE`) and then the PONG; an older one answers the PONG
only, which tells the client to use none. Only a client that saw
F_CLASS_STATE sends WATCH; the arbiter then sends CLASS_STATE at once and
again whenever the answer changes (a job of another class joins or leaves
the link), until the connection closes. A watching connection is not a job:
it needs no REGISTER and holds no place on the link. Old clients never send
the probe, so they never see a frame they do not know.
"""
import hashlib
import hmac
import logging
import os
import struct

MAGIC = b"HPA2"
NONCE_LEN = 32
MAC_LEN = 32
MAX_FRAME = 64 * 1024
MAX_NAME = 256
MIN_SECRET = 16                 # shorter secrets get a warning
STATS_PART = 60 * 1024          # bytes of JSON per STATS_REPLY fragment (< MAX_FRAME)

T_REGISTER = 0x01
T_REQUEST = 0x02
T_COMPLETE = 0x03
T_PING = 0x04
T_STATS = 0x05
T_CANCEL = 0x06
T_RENEW = 0x07
T_WATCH = 0x08
T_REGISTERED = 0x81
T_GRANT = 0x82
T_QUEUED = 0x83
T_PONG = 0x84
T_STATS_REPLY = 0x85
T_ERROR = 0x86
T_FEATURES = 0x87
T_CLASS_STATE = 0x88

PROBE = 0x4850_4150_524F_4245   # "HPAPROBE": a PING with this nonce asks for FEATURES
F_CLASS_STATE = 1               # WATCH / CLASS_STATE
FEATURES = F_CLASS_STATE        # what this arbiter offers

_LEN = struct.Struct(">I")
_U64 = struct.Struct(">BQ")
_U32 = struct.Struct(">BI")
_I32 = struct.Struct(">i")
_REQ = struct.Struct(">BQqQH")
_U16 = struct.Struct(">H")
_STEP = struct.Struct(">Q")
_DIR_SEQ = struct.Struct(">cQ")

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1
U64_MAX = (1 << 64) - 1

_HELLO_LEN = len(MAGIC) + NONCE_LEN
_ACCEPTED, _REJECTED = b"\x00", b"\x01"

log = logging.getLogger("horovod_prio.arbiter")


class ProtocolError(Exception):
    """A malformed, oversized or unauthenticated frame."""


class AuthError(ProtocolError):
    """The handshake failed: a wrong secret on one side."""


# ---------------------------------------------------------------- secrets

def load_secret(secret, who="arbiter"):
    """Normalise a shared secret (str -> UTF-8; surrounding whitespace stripped,
    on both sides, so a file's trailing newline does not matter) to non-empty
    bytes. Warns (logger ``horovod_prio.arbiter``) when it is shorter than
    :data:`MIN_SECRET` bytes: the secret is all that keeps other processes off
    the link, and a job talking to a fake arbiter reveals an HMAC of it."""
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    if isinstance(secret, (bytes, bytearray)):
        secret = bytes(secret).strip()
    if not isinstance(secret, (bytes, bytearray)) or not secret:
        raise ValueError("arbiter secret must be a non-empty str or bytes, got %r"
                         % (type(secret).__name__ if secret is not None else None,))
    if len(secret) < MIN_SECRET:
        log.warning("%s: the shared arbiter secret is only %d bytes; use at least %d random bytes "
                    "(e.g. head -c 32 /dev/urandom | base64)", who, len(secret), MIN_SECRET)
    return bytes(secret)


def read_secret_file(path, what="secret file"):
    """The whole file, surrounding whitespace stripped. ``ValueError`` naming
    the file when it cannot be read or is empty."""
    try:
        with open(path, "rb") as f:
            s = f.read().strip()
    except OSError as e:
        raise ValueError("cannot read %s %r: %s" % (what, path, e.strerror or e)) from None
    if not s:
        raise ValueError("%s %r is empty" % (what, path))
    return s


def config_secret(cfg):
    """A job's arbiter secret from its ``PriorityConfig``: ``arbiter_secret``,
    else the whole file ``arbiter_secret_file`` (:func:`read_secret_file`;
    ``ValueError`` naming it), else None."""
    secret = getattr(cfg, "arbiter_secret", None)
    path = getattr(cfg, "arbiter_secret_file", None)
    if secret is None and path:
        secret = read_secret_file(path, "arbiter secret file (HOROVOD_PRIO_ARBITER_SECRET_FILE)")
    return secret


def new_nonce():
    return os.urandom(NONCE_LEN)


def _h(key, msg):
    return hmac.digest(key, msg, "sha256")


def frame(body):
    """Length-prefix one body."""
    return _LEN.pack(len(body)) + body


# ---------------------------------------------------------------- handshake

def _keys(secret, cn, sn):
    ctx = MAGIC + cn + sn
    return _h(secret, b"cli" + ctx), _h(secret, b"srv" + ctx), _h(secret, b"key" + ctx)


class ClientHandshake:
    """Client side: ``hello()`` -> frame; ``on_challenge(body)`` -> PROOF frame
    (``session`` is usable from then on); ``on_verdict(body)`` checks the
    server's proof. Raises :class:`AuthError` / :class:`ProtocolError`."""

    __slots__ = ("_secret", "cn", "session", "_srv_proof", "done")

    def __init__(self, secret):
        self._secret = secret
        self.cn = new_nonce()
        self.session = None
        self._srv_proof = None
        self.done = False

    def hello(self):
        return frame(MAGIC + self.cn)

    def on_challenge(self, body):
        if len(body) != _HELLO_LEN or body[:4] != MAGIC:
            raise ProtocolError("bad CHALLENGE from arbiter (not protocol %r?)" % MAGIC.decode())
        cli, self._srv_proof, key = _keys(self._secret, self.cn, body[4:])
        self.session = Session(key, is_server=False)
        return frame(cli)

    def on_verdict(self, body):
        if body == _REJECTED:
            raise AuthError("authentication failed: the arbiter rejected our proof (wrong secret?)")
        if len(body) != 1 + MAC_LEN or body[:1] != _ACCEPTED:
            raise ProtocolError("bad VERDICT from arbiter")
        if not hmac.compare_digest(body[1:], self._srv_proof):
            raise AuthError("arbiter failed authentication (wrong secret?)")
        self.done = True


class ServerHandshake:
    """Server side: ``on_hello(body)`` -> CHALLENGE frame; ``on_proof(body)`` ->
    ``(reply_frame, session)``, ``session`` None when the proof is wrong (send
    the reply, then close)."""

    __slots__ = ("_secret", "_cn", "_sn")

    def __init__(self, secret):
        self._secret = secret
        self._cn = self._sn = None

    def on_hello(self, body):
        if self._cn is not None or len(body) != _HELLO_LEN or body[:4] != MAGIC:
            raise AuthError("bad HELLO")
        self._cn, self._sn = body[4:], new_nonce()
        return frame(MAGIC + self._sn)

    def on_proof(self, body):
        if self._cn is None:
            raise AuthError("PROOF before HELLO")
        cli, srv, key = _keys(self._secret, self._cn, self._sn)
        if len(body) != MAC_LEN or not hmac.compare_digest(body, cli):
            return frame(_REJECTED), None
        return frame(_ACCEPTED + srv), Session(key, is_server=True)


# ---------------------------------------------------------------- framing

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


_IPAD = bytes(b ^ 0x36 for b in range(256))
_OPAD = bytes(b ^ 0x5C for b in range(256))


class HmacSha256:
    """HMAC-SHA256 under one fixed key (RFC 2104), the same bytes as
    ``hmac.digest(key, msg, "sha256")``. The inner and outer hash states of
    the padded key are computed once and copied per message: the one-shot
    ``hmac.digest`` sets the key up on every call, which costs about three
    times the hashing of a frame."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key):
        if len(key) > 64:                   # SHA-256's block size
            key = hashlib.sha256(key).digest()
        key = bytes(key).ljust(64, b"\0")
        self._inner = hashlib.sha256(key.translate(_IPAD))
        self._outer = hashlib.sha256(key.translate(_OPAD))

    def digest(self, msg):
        h = self._inner.copy()
        h.update(msg)
        o = self._outer.copy()
        o.update(h.digest())
        return o.digest()


class Session:
    """MACs outgoing payloads and verifies incoming ones for one connection."""

    __slots__ = ("_mac", "_tx_dir", "_rx_dir", "_tx_seq", "_rx_seq")

    def __init__(self, key, is_server):
        self._mac = HmacSha256(key)
        self._tx_dir = b"S" if is_server else b"C"
        self._rx_dir = b"C" if is_server else b"S"
        self._tx_seq = 0
        self._rx_seq = 0

    def seal(self, payload):
        """Return the framed ``payload + MAC`` (advances the send counter)."""
        mac = self._mac.digest(_DIR_SEQ.pack(self._tx_dir, self._tx_seq) + payload)
        self._tx_seq += 1
        body = payload + mac
        return _LEN.pack(len(body)) + body

    def open(self, body):
        """Verify one body and return its payload. Raises ProtocolError."""
        if len(body) <= MAC_LEN:
            raise ProtocolError("frame too short for a MAC (%d bytes)" % len(body))
        payload = body[:-MAC_LEN]
        mac = self._mac.digest(_DIR_SEQ.pack(self._rx_dir, self._rx_seq) + payload)
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


def enc_register(job_id, link, job_class=0):
    return bytes([T_REGISTER]) + _str16(job_id) + _str16(link) + _I32.pack(job_class)


def enc_registered(lease_seconds):
    return _U32.pack(T_REGISTERED, min(int(lease_seconds * 1000), 0xFFFFFFFF))


def enc_watch(link, job_class):
    return bytes([T_WATCH]) + _str16(link) + _I32.pack(job_class)


def enc_features(bits=FEATURES):
    return _U32.pack(T_FEATURES, bits)


def enc_class_state(higher):
    return bytes([T_CLASS_STATE, 1 if higher else 0])


def enc_request(token, priority, nbytes, chunk_id, step=0):
    body = _REQ.pack(T_REQUEST, token, priority, nbytes, 0)[:-2] + _str16(chunk_id)
    return body + _STEP.pack(step) if step else body


def enc_token(kind, token):
    return _U64.pack(kind, token)


def enc_empty(kind):
    return bytes([kind])


def enc_text(kind, text):
    return bytes([kind]) + text.encode("utf-8")[:MAX_FRAME - 64]


def enc_stats_parts(text):
    """STATS_REPLY payloads carrying ``text`` (any size) in fragments."""
    data = text.encode("utf-8")
    n = max(1, -(-len(data) // STATS_PART))
    return [bytes([T_STATS_REPLY, int(i < n - 1)]) + data[i * STATS_PART:(i + 1) * STATS_PART]
            for i in range(n)]


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
    """-> ``(job_id, link, job_class)``."""
    job, pos = _read_str16(p, 1)
    link, pos = _read_str16(p, pos)
    if len(p) != pos + _I32.size:
        raise ProtocolError("bad length of REGISTER")
    if not job or not link:
        raise ProtocolError("empty job id or link in REGISTER")
    return job, link, _I32.unpack_from(p, pos)[0]


def dec_watch(p):
    """-> ``(link, job_class)``."""
    link, pos = _read_str16(p, 1)
    if len(p) != pos + _I32.size:
        raise ProtocolError("bad length of WATCH")
    if not link:
        raise ProtocolError("empty link in WATCH")
    return link, _I32.unpack_from(p, pos)[0]


def dec_features(p):
    """-> the arbiter's feature bits."""
    if len(p) != _U32.size:
        raise ProtocolError("bad length %d of FEATURES" % len(p))
    return _U32.unpack(p)[1]


def dec_class_state(p):
    """-> whether a higher class is connected to the watched link."""
    if len(p) != 2 or p[1] not in (0, 1):
        raise ProtocolError("bad CLASS_STATE")
    return bool(p[1])


def dec_registered(p):
    """-> the arbiter's lease in seconds."""
    if len(p) != _U32.size:
        raise ProtocolError("bad length %d of REGISTERED" % len(p))
    return _U32.unpack(p)[1] / 1000.0


def dec_request(p):
    """-> ``(token, priority, nbytes, chunk_id, step)`` (step 0: untagged)."""
    if len(p) < _REQ.size:
        raise ProtocolError("truncated REQUEST")
    _, token, priority, nbytes, _n = _REQ.unpack_from(p, 0)
    chunk, pos = _read_str16(p, _REQ.size - 2)
    if pos == len(p):
        return token, priority, nbytes, chunk, 0
    if len(p) != pos + _STEP.size:
        raise ProtocolError("trailing bytes in REQUEST")
    return token, priority, nbytes, chunk, _STEP.unpack_from(p, pos)[0]


def dec_token(p):
    if len(p) != _U64.size:
        raise ProtocolError("bad length %d for a token frame" % len(p))
    return _U64.unpack(p)[1]


def dec_stats_part(p):
    """-> ``(more, json_bytes)``."""
    if len(p) < 2 or p[1] not in (0, 1):
        raise ProtocolError("bad STATS_REPLY fragment")
    return bool(p[1]), p[2:]
