"""The protocol's frame MAC (protocol.HmacSha256, Session) against the standard library."""
import hashlib
import hmac
import struct

import pytest

from horovod_prio.arbiter import protocol as P


@pytest.mark.parametrize("klen", [1, 16, 32, 63, 64, 65, 100, 300])
def test_frame_mac_is_hmac_sha256_for_every_key_and_message_length(klen):
    """Keys shorter, as long as and longer than SHA-256's block (longer ones are
    hashed first), messages across the padding boundaries, one key reused for
    many messages (its precomputed state must not carry over)."""
    key = (hashlib.sha512(b"k%d" % klen).digest() * (klen // 64 + 1))[:klen]
    mac = P.HmacSha256(key)
    for mlen in (0, 1, 9 + 27, 55, 56, 63, 64, 65, 119, 120, 1000, 1, 0):
        msg = bytes((i * 7 + mlen) & 0xFF for i in range(mlen))
        assert mac.digest(msg) == hmac.digest(key, msg, "sha256"), (klen, mlen)


def test_sealed_frames_carry_the_mac_of_direction_sequence_and_payload():
    """The MAC the protocol defines (HMAC(key, dir + u64 seq + payload)), frame
    after frame, and the receiving side checks it: an altered payload, a
    frame replayed or taken out of order is refused."""
    key = b"k" * 32
    srv, cli = P.Session(key, is_server=True), P.Session(key, is_server=False)
    frames = []
    for seq in range(3):
        payload = P.enc_token(P.T_GRANT, 100 + seq)
        frame = srv.seal(payload)
        (n,) = struct.unpack(">I", frame[:4])
        body = frame[4:]
        assert n == len(body) == len(payload) + P.MAC_LEN
        want = hmac.digest(key, b"S" + seq.to_bytes(8, "big") + payload, "sha256")
        assert body == payload + want
        frames.append(body)
    assert cli.open(frames[0]) == P.enc_token(P.T_GRANT, 100)
    with pytest.raises(P.ProtocolError, match="bad frame MAC"):
        cli.open(frames[2])                     # out of order
    with pytest.raises(P.ProtocolError, match="bad frame MAC"):
        cli.open(frames[0])                     # replayed
    altered = bytearray(frames[1])
    altered[3] ^= 1
    with pytest.raises(P.ProtocolError, match="bad frame MAC"):
        cli.open(bytes(altered))
    assert cli.open(frames[1]) == P.enc_token(P.T_GRANT, 101)
    # the other direction uses "C": a server frame never opens as a client one
    with pytest.raises(P.ProtocolError, match="bad frame MAC"):
        srv.open(frames[2])
