"""Screen capture from Xvfb's memory-mapped framebuffer (`Xvfb -fbdir`), PNG encoding, settling.

Xvfb keeps its screen as an XWD file that it updates in place; reading that file is a
screenshot taken by the X server itself, with no X client round trip.
"""

from __future__ import annotations

import hashlib
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Frame:
    """One screenshot: `rgb` is width*height*3 bytes, row-major, top-left first."""

    width: int
    height: int
    rgb: bytes


class Framebuffer:
    """Reads the XWD framebuffer file that Xvfb writes for screen 0 (24-bit depth, 32 bpp)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def raw(self) -> tuple[int, int, int, bytes]:
        """(width, height, bytes_per_line, pixel bytes in BGRX order) as Xvfb holds them now."""
        with open(self.path, "rb") as f:
            data = f.read()
        fields = struct.unpack(">25I", data[:100])
        header_size, width, height = fields[0], fields[4], fields[5]
        bits_per_pixel, bytes_per_line, ncolors = fields[11], fields[12], fields[19]
        if bits_per_pixel != 32 or fields[7] != 0:
            raise RuntimeError(f"unsupported framebuffer: {bits_per_pixel} bpp, byte order {fields[7]}")
        start = header_size + 12 * ncolors
        return width, height, bytes_per_line, data[start : start + bytes_per_line * height]

    def digest(self) -> bytes:
        """A hash of the current pixels: equal digests mean an unchanged screen."""
        return hashlib.blake2b(self.raw()[3], digest_size=16).digest()

    def frame(self) -> Frame:
        """The current screen as RGB."""
        width, height, stride, px = self.raw()
        if stride != width * 4:
            px = b"".join(px[y * stride : y * stride + width * 4] for y in range(height))
        rgb = bytearray(width * height * 3)
        rgb[0::3], rgb[1::3], rgb[2::3] = px[2::4], px[1::4], px[0::4]
        return Frame(width, height, bytes(rgb))

    def settle(self, timeout: float, interval: float = 0.05, stable_polls: int = 2,
               cpu_s: Callable[[], float] = lambda: 0.0, busy_share: float = 0.1) -> tuple[bool, float]:
        """Wait until the screen stops changing and the apps are idle: `stable_polls` polls in a
        row with the same digest and less than `busy_share` of a CPU used by `cpu_s()` (the
        apps' CPU seconds so far) since the poll before. An app busy loading or saving a file
        does not repaint for a while, so a still screen alone would not mean it is done.

        Returns (settled, seconds waited); gives up after `timeout` seconds.
        """
        start = time.monotonic()
        last, used, same = self.digest(), cpu_s(), 0
        while True:
            time.sleep(interval)
            now, used_now = self.digest(), cpu_s()
            idle = used_now - used < busy_share * interval
            same = same + 1 if now == last and idle else 0
            last, used = now, used_now
            waited = time.monotonic() - start
            if same >= stable_polls:
                return True, waited
            if waited >= timeout:
                return False, waited


def png(frame: Frame, level: int = 1) -> bytes:
    """Encode an RGB frame as PNG (filter 0 on every row)."""
    row = frame.width * 3
    raw = b"".join(b"\x00" + frame.rgb[y * row : (y + 1) * row] for y in range(frame.height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", frame.width, frame.height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(raw, level)) + chunk(b"IEND", b""))
