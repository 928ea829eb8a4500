"""OSWorld's metrics on images (GIMP's exports and the like), read with Pillow and numpy.

Most compare the agent's image (`src`) with the task's (`tgt`) by structural similarity:
`ssim` is the mean SSIM over 7x7 windows (uniform weights, sample covariance, K1 0.01,
K2 0.03, 8-bit range; channels averaged), the quantity OSWorld computes with scikit-image,
written here in numpy; two images of different shapes are not similar. "Structure kept" is
SSIM >= 0.9 unless a metric says otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image, ImageStat, UnidentifiedImageError

_WIN = 7


def _open(path: Any) -> Image.Image | None:
    """The image, loaded, or None (no path, not an image)."""
    if not isinstance(path, str):
        return None
    try:
        with Image.open(path) as img:
            img.load()
            return img
    except (OSError, UnidentifiedImageError, ValueError):
        return None


def _window_means(x: np.ndarray) -> np.ndarray:
    """Means of every full 7x7 window of a 2-D array (summed-area table)."""
    s = np.pad(x, ((1, 0), (1, 0))).cumsum(0).cumsum(1)
    return (s[_WIN:, _WIN:] - s[:-_WIN, _WIN:] - s[_WIN:, :-_WIN] + s[:-_WIN, :-_WIN]) / _WIN ** 2


def ssim(a: Any, b: Any) -> float:
    """Structural similarity of two images (or arrays) of the same shape; 0.0 otherwise."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim not in (2, 3) or min(x.shape[:2]) < _WIN:
        return 0.0
    if x.ndim == 2:
        x, y = x[..., None], y[..., None]
    c1, c2, n = (0.01 * 255) ** 2, (0.03 * 255) ** 2, _WIN ** 2
    scores = []
    for ch in range(x.shape[2]):
        xa, ya = x[..., ch], y[..., ch]
        mx, my = _window_means(xa), _window_means(ya)
        vx = (_window_means(xa * xa) - mx * mx) * n / (n - 1)
        vy = (_window_means(ya * ya) - my * my) * n / (n - 1)
        cov = (_window_means(xa * ya) - mx * my) * n / (n - 1)
        s = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
        scores.append(s.mean())
    return float(np.mean(scores))


def _similar(a: Any, b: Any, threshold: float = 0.9) -> bool:
    return ssim(a, b) >= threshold


def _pair(src: Any, tgt: Any) -> tuple[Image.Image, Image.Image] | None:
    a, b = _open(src), _open(tgt)
    return (a, b) if a is not None and b is not None else None


def compare_images(image1: Any, image2: Any) -> float:
    """SSIM of the two images in greyscale, the larger resized (Lanczos) to the smaller's size
    (the smaller size taken as OSWorld does: the lesser (width, height) pair)."""
    pair = _pair(image1, image2)
    if pair is None:
        return 0.0
    size = min(pair[0].size, pair[1].size)
    a, b = (img.convert("L").resize(size, Image.Resampling.LANCZOS) for img in pair)
    return max(0.0, ssim(a, b))


def check_structure_sim(src: Any, tgt: Any) -> float:
    """The images are structurally alike (SSIM >= 0.9)."""
    pair = _pair(src, tgt)
    return float(pair is not None and _similar(*pair))


def check_structure_sim_resized(src: Any, tgt: Any) -> float:
    """The image, resized to the target's size, is structurally alike."""
    pair = _pair(src, tgt)
    return float(pair is not None and _similar(pair[0].resize(pair[1].size), pair[1]))


def check_file_exists_and_structure_sim(src: Any, tgt: Any) -> float:
    """The exported file exists and is structurally alike."""
    return float(isinstance(src, str) and os.path.isfile(src) and check_structure_sim(src, tgt) == 1.0)


def _brightness(img: Image.Image) -> float:
    return ImageStat.Stat(img.convert("L")).mean[0]


def check_brightness_decrease_and_structure_sim(src: Any, tgt: Any) -> float:
    """The image is darker than the target, and with both scaled to mean brightness 128 they
    differ by a mean squared error under 0.03 (on a 0..1 scale)."""
    pair = _pair(src, tgt)
    if pair is None:
        return 0.0
    a, b = pair
    if not _brightness(a) < _brightness(b) or a.size != b.size or a.mode != b.mode or min(map(_brightness, pair)) == 0:
        return 0.0
    na, nb = (np.clip(np.asarray(i, dtype=np.float64) * (128 / _brightness(i)), 0, 255) // 1 for i in pair)
    return float(np.mean((na / 255 - nb / 255) ** 2) < 0.03)


def check_contrast_increase_and_structure_sim(src: Any, tgt: Any) -> float:
    """The image has more contrast (pixel standard deviation) than the target and keeps its
    structure (SSIM >= 0.65)."""
    pair = _pair(src, tgt)
    if pair is None:
        return 0.0
    stds = [float(np.std(np.asarray(i, dtype=np.float32))) for i in pair]
    return float(stds[0] > stds[1] and _similar(*pair, threshold=0.65))


def check_saturation_increase_and_structure_sim(src: Any, tgt: Any) -> float:
    """The image is more saturated than the target (mean HSV saturation) and its hue and value
    channels are structurally alike."""
    pair = _pair(src, tgt)
    if pair is None:
        return 0.0
    (h1, s1, v1), (h2, s2, v2) = (i.convert("RGB").convert("HSV").split() for i in pair)
    return float(np.mean(np.asarray(s1)) > np.mean(np.asarray(s2)) and _similar(h1, h2) and _similar(v1, v2))


def check_palette_and_structure_sim(src: Any, tgt: Any) -> float:
    """The image uses a colour palette (mode P) and, in RGB, is structurally alike."""
    pair = _pair(src, tgt)
    return float(pair is not None and pair[0].mode == "P" and _similar(pair[0].convert("RGB"), pair[1]))


def check_image_mirror(src: Any, tgt: Any) -> float:
    """The target is the image flipped left to right (SSIM >= 0.99)."""
    pair = _pair(src, tgt)
    return float(pair is not None and _similar(pair[0].transpose(Image.Transpose.FLIP_LEFT_RIGHT), pair[1], 0.99))


def check_green_background(src: Any, tgt: Any) -> float:
    """Wherever the target is not black, the image is green (green above red and blue)."""
    pair = _pair(src, tgt)
    if pair is None or pair[0].size != pair[1].size:
        return 0.0
    a, b = (np.asarray(i.convert("RGB"), dtype=np.int32) for i in pair)
    background = b.any(axis=2)
    green = (a[..., 1] > a[..., 0]) & (a[..., 1] > a[..., 2])
    return float(bool(np.all(green[background])))


def check_image_size(src: Any, rule: dict) -> float:
    """The image is rule["width"] wide and rule["height"] high (either may be left out)."""
    img = _open(src)
    return float(img is not None and rule.get("width") in (None, img.size[0])
                 and rule.get("height") in (None, img.size[1]))


def check_image_file_size(src: Any, rule: dict) -> float:
    """The file is smaller than rule["max_size"] bytes."""
    return float(isinstance(src, str) and os.path.isfile(src) and os.path.getsize(src) < rule["max_size"])


def check_textbox_on_leftside(src: Any) -> float:
    """The leftmost dark pixel (grey under 128) is within the image's left 5%."""
    img = _open(src)
    if img is None:
        return 0.0
    dark = np.argwhere(np.asarray(img.convert("L")) < 128)
    return float(dark.size > 0 and dark[:, 1].min() < img.size[0] * 0.05)


def check_triangle_position(src: Any) -> float:
    """The second most common colour (the shape on a plain background) has its centroid within
    5% of the image's centre, on both axes."""
    img = _open(src)
    if img is None:
        return 0.0
    px = np.asarray(img.convert("RGB"))
    colours, counts = np.unique(px.reshape(-1, 3), axis=0, return_counts=True)
    if len(colours) < 2:
        return 0.0
    shape = colours[np.argsort(counts)[-2]]
    centroid = np.argwhere(np.all(px == shape, axis=2)).mean(axis=0)
    dims = np.array(px.shape[:2])
    return float(bool(np.all(np.abs(centroid - dims / 2) < 0.05 * dims)))


def compare_image_list(results: Any, expected: Any) -> float:
    """Each image has exactly the pixels of its expected image."""
    pairs = zip(results, expected, strict=False) if isinstance(expected, list) else [(results, expected)]
    for a, b in pairs:
        pair = _pair(a, b)
        if pair is None or pair[0].size != pair[1].size \
                or pair[0].convert("RGBA").tobytes() != pair[1].convert("RGBA").tobytes():
            return 0.0
    return 1.0


METRICS: dict[str, Callable[..., float]] = {
    f.__name__: f for f in (compare_images, check_structure_sim, check_structure_sim_resized,
                            check_file_exists_and_structure_sim, check_brightness_decrease_and_structure_sim,
                            check_contrast_increase_and_structure_sim, check_saturation_increase_and_structure_sim,
                            check_palette_and_structure_sim, check_image_mirror, check_green_background,
                            check_image_size, check_image_file_size, check_textbox_on_leftside,
                            check_triangle_position, compare_image_list)
}
