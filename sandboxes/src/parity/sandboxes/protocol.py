"""Host side of the helper protocol: length-prefixed JSON frames over a byte stream.

The sandbox side is helper.py, which cannot import this package and keeps its own copy.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any, BinaryIO, Protocol


class Transport(Protocol):
    """A byte stream to the helper: the pipes of a local process or a container's attach socket."""

    def send(self, data: bytes) -> None: ...

    def recv(self, n: int, deadline: float) -> bytes:
        """Up to n bytes; b"" at end of stream; TimeoutError past `deadline` (time.monotonic)."""
        ...

    def close(self) -> None: ...


def encode(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def recv_exact(transport: Transport, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = transport.recv(n - len(buf), deadline)
        if not chunk:
            raise EOFError("the sandbox helper closed its end")
        buf += chunk
    return bytes(buf)


def read_frame(transport: Transport, deadline: float) -> dict[str, Any]:
    (size,) = struct.unpack(">I", recv_exact(transport, 4, deadline))
    return json.loads(recv_exact(transport, size, deadline))


class PipeTransport:
    """The stdin/stdout pipes of a local helper process (the Popen's file objects)."""

    def __init__(self, writer: BinaryIO, reader: BinaryIO) -> None:
        self._files = (writer, reader)
        self._w, self._r = writer.fileno(), reader.fileno()
        # poll, not select: a worker with hundreds of sandboxes and sockets open hands out
        # descriptors above select's limit of 1024
        self._poll = select.poll()
        self._poll.register(self._r, select.POLLIN)

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._w, view) :]

    def recv(self, n: int, deadline: float) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0 or not self._poll.poll(left * 1000):
            raise TimeoutError("the sandbox helper did not answer in time")
        return os.read(self._r, n)

    def close(self) -> None:
        for f in self._files:
            f.close()
