"""A raw HTTP/2 client for hostile gRPC clients (tests/api/test_grpc_slots.py, the soak): frames
written by hand, as an attacker would, so that a call can send its headers and part of its
message and then trickle (no HTTP/2 library is in the lock files, and grpcio's client always
sends a message whole).

Headers are encoded as HPACK literals without indexing (RFC 7541, 6.2.2), the simplest form every
decoder takes. Frames from the server are read on a thread: its SETTINGS are acknowledged and
remembered, its PINGs answered, and each stream it ends (trailers with END_STREAM, or
RST_STREAM) is noted with the time; the server's header blocks are not decoded.
"""

from __future__ import annotations

import socket
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
# gRPC's message prefix: a compression flag, then the message's length (big-endian).
GRPC_PREFIX_BYTES = 5


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload
    )


def _integer(value: int, prefix_bits: int) -> bytes:
    """An HPACK integer with a ``prefix_bits`` prefix (the flag bits above it clear)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out, value = bytearray([limit]), value - limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def _string(text: str) -> bytes:
    data = text.encode()
    return _integer(len(data), 7) + data  # H = 0: no Huffman coding


def header_block(headers: list[tuple[str, str]]) -> bytes:
    """Literal header fields without indexing, new names (0000 0000, name, value)."""
    return b"".join(b"\x00" + _string(name) + _string(value) for name, value in headers)


class RawHttp2Connection:
    """One HTTP/2 connection to ``host:port`` (plain text, prior knowledge, as gRPC speaks)."""

    def __init__(self, host: str, port: int) -> None:
        self.authority = f"{host}:{port}"
        self.sock = socket.create_connection((host, port), timeout=30)
        self.settings: dict[int, int] = {}
        self.ended: dict[int, float] = {}  # stream -> when the server ended it
        self.closed = threading.Event()
        self._next_stream = 1
        self._send_lock = threading.Lock()
        self._settings_seen = threading.Event()
        self.send(PREFACE + frame(SETTINGS, 0, 0))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._settings_seen.wait(10)

    def send(self, data: bytes) -> None:
        with self._send_lock:
            self.sock.sendall(data)

    def start_call(
        self, path: str, metadata: list[tuple[str, str]], declared: int, first: bytes
    ) -> int:
        """Open a stream calling ``path`` with ``metadata``: its headers, then a message prefix
        declaring ``declared`` bytes and ``first`` of them. Returns the stream's id."""
        stream = self._next_stream
        self._next_stream += 2
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", self.authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *metadata,
        ]
        prefix = b"\x00" + declared.to_bytes(4, "big")
        self.send(
            frame(HEADERS, END_HEADERS, stream, header_block(headers))
            + frame(DATA, 0, stream, prefix + first)
        )
        return stream

    def trickle(self, stream: int, data: bytes = b"\x00") -> None:
        """Send a few more bytes of a stream's message (ignored once the server has ended it)."""
        if stream not in self.ended and not self.closed.is_set():
            try:
                self.send(frame(DATA, 0, stream, data))
            except OSError:
                self.closed.set()

    def close(self) -> None:
        self.closed.set()
        self.sock.close()

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                buffer += chunk
                while len(buffer) >= 9:
                    length = int.from_bytes(buffer[:3], "big")
                    if len(buffer) < 9 + length:
                        break
                    kind, flags = buffer[3], buffer[4]
                    stream = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
                    payload, buffer = buffer[9 : 9 + length], buffer[9 + length :]
                    self._on_frame(kind, flags, stream, payload)
        except OSError:
            pass
        finally:
            self.closed.set()
            self._settings_seen.set()

    def _on_frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == SETTINGS and not flags & ACK:
            for at in range(0, len(payload), 6):
                identifier = int.from_bytes(payload[at : at + 2], "big")
                self.settings[identifier] = int.from_bytes(payload[at + 2 : at + 6], "big")
            self.send(frame(SETTINGS, ACK, 0))
            self._settings_seen.set()
        elif kind == PING and not flags & ACK:
            self.send(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM or (kind in (HEADERS, DATA) and flags & END_STREAM):
            self.ended.setdefault(stream, time.monotonic())
        elif kind == GOAWAY:
            self.closed.set()
