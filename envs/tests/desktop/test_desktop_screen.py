"""Screen capture from an XWD framebuffer file, PNG encoding and settling (no X server needed)."""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path

from parity.envs.desktop.guest.screen import Framebuffer, png


def write_xwd(path: Path, width: int, height: int, pixels: bytes) -> None:
    """An XWD file shaped like Xvfb's -fbdir screen: 32 bpp, LSB first, no colormap."""
    name = b"Xvfb main window\x00"
    header = [100 + len(name), 7, 2, 24, width, height, 0, 0, 32, 0, 32, 32, width * 4, 4,
              0xFF0000, 0xFF00, 0xFF, 8, 0, 0, width, height, 0, 0, 0]
    path.write_bytes(struct.pack(">25I", *header) + name + pixels)


def test_frame_is_rgb_and_png_round_trips(tmp_path: Path) -> None:
    bgrx = bytes([1, 2, 3, 0, 4, 5, 6, 0, 7, 8, 9, 0, 10, 11, 12, 0, 13, 14, 15, 0, 16, 17, 18, 0])
    write_xwd(tmp_path / "fb", 3, 2, bgrx)
    frame = Framebuffer(str(tmp_path / "fb")).frame()
    assert (frame.width, frame.height) == (3, 2)
    assert frame.rgb == bytes([3, 2, 1, 6, 5, 4, 9, 8, 7, 12, 11, 10, 15, 14, 13, 18, 17, 16])
    data = png(frame)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    raw = zlib.decompress(data[data.index(b"IDAT") + 4 : data.index(b"IEND") - 8])
    assert raw == b"\x00" + frame.rgb[:9] + b"\x00" + frame.rgb[9:]


def test_settle_returns_once_the_screen_is_still(tmp_path: Path) -> None:
    write_xwd(tmp_path / "fb", 2, 1, bytes(8))
    settled, waited = Framebuffer(str(tmp_path / "fb")).settle(timeout=5.0, interval=0.01, stable_polls=2)
    assert settled is True and waited < 5.0


class ChangingFramebuffer(Framebuffer):
    """A framebuffer file that gets a new pixel value before every read: a screen that never stops."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path))
        self.file, self.value = path, 0

    def raw(self) -> tuple[int, int, int, bytes]:
        self.value = (self.value + 1) % 256
        write_xwd(self.file, 2, 1, bytes([self.value] * 8))
        return super().raw()


def test_settle_gives_up_at_its_timeout(tmp_path: Path) -> None:
    settled, waited = ChangingFramebuffer(tmp_path / "fb").settle(timeout=0.2, interval=0.01)
    assert settled is False and waited >= 0.2


def test_settle_waits_while_the_apps_are_busy(tmp_path: Path) -> None:
    """A still screen is not settled while the apps use CPU (LibreOffice saving a file does not
    repaint); under busy_share of a CPU counts as idle."""
    write_xwd(tmp_path / "fb", 2, 1, bytes(8))
    fb, clock = Framebuffer(str(tmp_path / "fb")), time.monotonic
    busy = fb.settle(timeout=0.3, interval=0.01, cpu_s=clock)  # uses a whole CPU
    assert busy[0] is False and busy[1] >= 0.3
    light = fb.settle(timeout=5.0, interval=0.01, cpu_s=lambda: clock() * 0.05)  # 5% of a CPU
    assert light[0] is True and light[1] < 5.0
