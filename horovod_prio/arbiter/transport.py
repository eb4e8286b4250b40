"""A non-blocking framed connection, shared by the arbiter's server and client.

:class:`Transport` wraps one non-blocking TCP socket: ``read()`` splits what
arrived into frame bodies (:class:`~.protocol.FrameReader`), ``write()``
sends at once when nothing is queued and queues the rest (up to
``max_buffer`` bytes), ``flush()`` sends the queue when the socket is
writable. I/O failures never raise: the first one is kept in ``error`` (a
sentence) and the owner closes the connection when it sees it; a malformed
frame raises :class:`~.protocol.ProtocolError` from ``read()``. Not
thread-safe: the owner serialises calls (the server's loop thread; the
client's lock).
"""
import socket

from .protocol import FrameReader

# recv() buffer: keep it <= 64 KiB; larger sizes make CPython allocate (mmap) and
# shrink a big bytes object on every call (measured ~20 us extra per recv here).
RECV_SIZE = 65536


class Transport:
    __slots__ = ("sock", "reader", "outbuf", "max_buffer", "error")

    def __init__(self, sock, max_frame, max_buffer=1 << 20):
        self.sock = sock
        self.reader = FrameReader(max_frame)
        self.outbuf = bytearray()
        self.max_buffer = max_buffer
        self.error = None

    def _fail(self, why):
        if self.error is None:
            self.error = why

    def read(self):
        """Frame bodies that arrived (``[]`` if none); on EOF or a socket error
        ``error`` is set. Raises ProtocolError for a malformed frame."""
        if self.error is not None:
            return []
        try:
            data = self.sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError as e:
            self._fail("connection error: %s" % e)
            return []
        if not data:
            self._fail("closed by peer")
            return []
        return self.reader.feed(data)

    def write(self, data):
        """Send ``data`` now if nothing is queued, queue what the socket does not take."""
        if self.error is not None:
            return
        if not self.outbuf:
            try:
                n = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                self._fail("send failed: %s" % e)
                return
            if n == len(data):
                return
            data = data[n:]
        self.outbuf += data
        if len(self.outbuf) > self.max_buffer:
            self._fail("peer does not read (%d bytes unsent)" % len(self.outbuf))

    def flush(self):
        """Send queued bytes (call when the socket is writable)."""
        if not self.outbuf or self.error is not None:
            return
        try:
            n = self.sock.send(self.outbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._fail("send failed: %s" % e)
            return
        del self.outbuf[:n]

    @property
    def wants_write(self):
        return bool(self.outbuf) and self.error is None

    @property
    def buffered(self):
        return len(self.outbuf)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def parse_address(address):
    """``"host:port"`` (``"[v6]:port"``) or ``(host, port)`` -> ``(host, port)``."""
    if isinstance(address, (tuple, list)) and len(address) == 2:
        host, port = address
    elif isinstance(address, str) and ":" in address:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
    else:
        raise ValueError("arbiter address must be 'host:port', got %r" % (address,))
    try:
        port = int(port)
    except (TypeError, ValueError):
        raise ValueError("arbiter address must be 'host:port' with a numeric port, got %r"
                         % (address,)) from None
    if not host or not 0 < port < 65536:
        raise ValueError("arbiter address must be 'host:port' with port 1..65535, got %r"
                         % (address,))
    return host, port


def tcp_socket(host, port):
    """A non-blocking TCP_NODELAY socket for ``host:port`` and its sockaddr."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    nodelay(sock)
    return sock, sockaddr


def nodelay(sock):
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass
