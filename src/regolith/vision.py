"""Images for qwen4_exp and Qwen3.5 MoE (the same Qwen3-VL vision tower): decoding, the reference preprocessing, the vision tower with elastic memory, and
image placeholders in chat prompts.

- :func:`load_image` decodes a path, bytes, a data URL or a PIL image (PNG, JPEG, WebP, GIF, BMP) with a
  pixel limit checked before decoding; anything unusable raises :class:`regolith.ImageError`.
- :class:`ImageProcessor` is transformers' Qwen2-VL image processor (PIL backend, the class qwen4_exp's
  processor config names) in Pillow + numpy: RGB with alpha composited on white, ``smart_resize`` (bicubic)
  to multiples of patch x merge within [min_pixels, max_pixels], rescale, normalise, and patches in
  merge-block order as ``(C, T, p, p)`` rows.
- :class:`VisionTower` loads the projector weights on the first image, unloads them after an idle timeout,
  and caches image embeddings by content hash (bounded, least recently used first out).
- An image in a prompt is ``<|vision_start|><|image_pad|><|vision_end|>`` (the Qwen3-VL processor's
  placeholder); its ``<|image_pad|>`` expands to one token per merged patch, and those tokens take the
  image's M-RoPE positions (:func:`mrope_positions`, transformers' ``get_rope_index``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
import os
import re
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ImageError, ModelFormatError

__all__ = [
    "IMAGE_PAD",
    "IMAGE_PLACEHOLDER",
    "ImageEmbedding",
    "ImageProcessor",
    "ImageSpan",
    "VisionTower",
    "load_image",
    "mrope_positions",
    "render_with_images",
    "smart_resize",
    "split_images",
]

IMAGE_PAD = "<|image_pad|>"
IMAGE_PLACEHOLDER = "<|vision_start|>" + IMAGE_PAD + "<|vision_end|>"
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
MAX_IMAGE_PIXELS = 50_000_000  # decoded pixels refused before decoding (decompression bombs)
_BICUBIC = 3  # PIL.Image.Resampling.BICUBIC, the processor's resample


def load_image(source: Any, *, max_pixels: int = MAX_IMAGE_PIXELS) -> Any:
    """A decoded PIL image from a PIL image, bytes, a ``data:image/...;base64,`` URL or a file path.

    Raises :class:`regolith.ImageError` for a remote URL (images are never downloaded), bad base64, data that
    is not an image or is truncated, a format other than PNG, JPEG, WebP, GIF or BMP, or more than
    ``max_pixels`` pixels (checked from the header, before decoding).
    """
    from PIL import Image, UnidentifiedImageError

    if isinstance(source, Image.Image):
        _check_pixels(source.size, max_pixels)
        return source
    if isinstance(source, str) and source.startswith(("http://", "https://")):
        raise ImageError(
            "remote image URLs are not fetched; send the image inline as a data URL "
            "(data:image/png;base64,...)"
        )
    if isinstance(source, str) and source.startswith("data:"):
        data = _data_url(source)
    elif isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif isinstance(source, (str, os.PathLike)):
        try:
            data = Path(source).read_bytes()
        except OSError as e:
            raise ImageError(f"cannot read image file {os.fspath(source)!r}: {e.strerror or e}") from None
    else:
        raise ImageError(
            f"an image must be a path, bytes, a data URL or a PIL image, not {type(source).__name__}"
        )
    try:
        with Image.open(io.BytesIO(data)) as probe:
            fmt, size = probe.format, probe.size
    except UnidentifiedImageError:
        raise ImageError(
            f"cannot decode the image: {len(data)} bytes that are not a known image format "
            f"(supported: {', '.join(FORMATS)})"
        ) from None
    except Image.DecompressionBombError as e:
        n = re.search(r"\((\d+) pixels\)", str(e))
        raise ImageError(
            f"the image has {n.group(1) if n else 'too many'} pixels, more than the {max_pixels} allowed "
            "(a decompression bomb, or scale it down first)"
        ) from None
    if fmt not in FORMATS:
        raise ImageError(f"unsupported image format {fmt} (supported: {', '.join(FORMATS)})")
    _check_pixels(size, max_pixels)
    try:
        image = Image.open(io.BytesIO(data), formats=[fmt])
        image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise ImageError(f"the {fmt} image is corrupt or truncated: {e}") from None
    return image


def _data_url(url: str) -> bytes:
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        raise ImageError("an image data URL must look like data:image/<type>;base64,<data>")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the image data URL holds invalid base64") from None


def _check_pixels(size: tuple[int, int], max_pixels: int) -> None:
    w, h = size
    if w <= 0 or h <= 0:
        raise ImageError(f"the image is empty ({w}x{h} pixels)")
    if w * h > max_pixels:
        raise ImageError(
            f"the image is {w}x{h} = {w * h} pixels, more than the {max_pixels} allowed "
            "(a decompression bomb, or scale it down first)"
        )


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' Qwen2-VL ``smart_resize``: (height, width) rounded to multiples of ``factor``, scaled
    into [min_pixels, max_pixels] keeping the aspect ratio. Raises ImageError past an aspect ratio of 200."""
    if max(height, width) / min(height, width) > 200:
        raise ImageError(
            f"the image's aspect ratio {max(height, width) / min(height, width):.1f} exceeds 200 ({width}x{height})"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ImageProcessor:
    """The qwen4_exp image preprocessing (transformers' ``Qwen2VLImageProcessorPil``)."""

    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    min_pixels: int = 65536
    max_pixels: int = 16777216

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any], temporal_patch_size: int) -> ImageProcessor:
        """From a projector GGUF's metadata. Pixel limits default to llama.cpp's for Qwen-VL projectors
        (8 to 4096 image tokens) when the file does not set ``clip.vision.image_{min,max}_pixels``."""
        patch = int(md["clip.vision.patch_size"])
        merge = int(md.get("clip.vision.spatial_merge_size", 2))
        unit = (patch * merge) ** 2
        return cls(
            patch_size=patch,
            merge_size=merge,
            temporal_patch_size=temporal_patch_size,
            image_mean=tuple(float(x) for x in md.get("clip.vision.image_mean", (0.5, 0.5, 0.5))),
            image_std=tuple(float(x) for x in md.get("clip.vision.image_std", (0.5, 0.5, 0.5))),
            min_pixels=int(md.get("clip.vision.image_min_pixels", 8 * unit)),
            max_pixels=int(md.get("clip.vision.image_max_pixels", 4096 * unit)),
        )

    def __call__(self, image: Any) -> tuple[np.ndarray, tuple[int, int, int]]:
        """(pixel_values [t*h*w, C*T*p*p] float32, grid (t, h, w) in patches) of a PIL image."""
        from PIL import Image

        has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
        if has_alpha:
            rgba = image.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            rgb = Image.alpha_composite(white, rgba).convert("RGB")
        else:
            rgb = image.convert("RGB")
        p, m, tp = self.patch_size, self.merge_size, self.temporal_patch_size
        h, w = smart_resize(rgb.height, rgb.width, p * m, self.min_pixels, self.max_pixels)
        pixels = np.asarray(rgb.resize((w, h), resample=_BICUBIC))  # [h, w, 3] uint8
        x = (pixels.astype(np.float64) * (1 / 255)).astype(np.float32)
        x = (x - np.array(self.image_mean, np.float32)) / np.array(self.image_std, np.float32)
        gh, gw = h // p, w // p
        x = x.transpose(2, 0, 1).reshape(3, gh // m, m, p, gw // m, m, p)
        x = x.transpose(1, 4, 2, 5, 0, 3, 6)  # (gh/m, gw/m, m, m, C, p, p): merge blocks, then patches
        x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], tp, p, p))  # one frame, repeated
        return np.ascontiguousarray(x.reshape(gh * gw, 3 * tp * p * p), dtype=np.float32), (1, gh, gw)


@dataclass(frozen=True)
class ImageEmbedding:
    """An image as the text model sees it: ``embeddings`` [tokens, hidden] float32, the patch ``grid``
    (t, h, w) and the ``digest`` (SHA-256) of its preprocessed pixels, the embedding cache's key."""

    embeddings: np.ndarray
    grid: tuple[int, int, int]
    digest: bytes


@dataclass(frozen=True)
class ImageSpan:
    """An image's tokens in a prompt: ``start`` (token index), the embedding, and the merge size."""

    start: int
    image: ImageEmbedding
    merge: int

    @property
    def n_tokens(self) -> int:
        t, h, w = self.image.grid
        return t * h * w // (self.merge * self.merge)

    @property
    def end(self) -> int:
        return self.start + self.n_tokens

    @property
    def advance(self) -> int:
        """How far the image moves the text position: max(h, w) in merged patches (transformers)."""
        return max(self.image.grid[1], self.image.grid[2]) // self.merge


def mrope_positions(spans: Sequence[ImageSpan], start: int, n: int) -> np.ndarray:
    """M-RoPE positions [n, 3] (t, h, w) of tokens start..start+n-1 of a sequence with image ``spans``
    (sorted): text tokens carry index + the shift of the images before them on every axis; an image's tokens
    carry (p, p + row, p + column) from the position p its first token would have had as text."""
    idx = np.arange(start, start + n, dtype=np.int64)
    shift = np.zeros(n, np.int64)
    pos = np.empty((n, 3), np.int64)
    image_rows: list[tuple[np.ndarray, np.ndarray]] = []
    delta = 0
    for sp in spans:
        inside = (idx >= sp.start) & (idx < sp.end)
        if inside.any():
            k = idx[inside] - sp.start
            gw = sp.image.grid[2] // sp.merge
            p0 = sp.start + delta
            image_rows.append((inside, np.stack([np.full_like(k, p0), p0 + k // gw, p0 + k % gw], axis=1)))
        delta += sp.advance - sp.n_tokens
        shift[idx >= sp.end] = delta
    pos[:] = (idx + shift)[:, None]
    for inside, rows in image_rows:
        pos[inside] = rows
    return pos


class VisionTower:
    """The vision encoder of a projector GGUF, loaded on the first image and unloaded after ``idle_unload``
    seconds without one (None: kept), with image embeddings cached by content hash up to ``cache_bytes``,
    computed on ``backend`` (as :meth:`regolith.Model.load` names it; "" for the default).

    Thread-safe: encodings run one at a time; unloading waits for a running one.
    """

    def __init__(
        self, path: str, *, idle_unload: float | None = 300.0, cache_bytes: int = 256 << 20, backend: str = ""
    ):
        from . import gguf as _gguf

        if idle_unload is not None and idle_unload <= 0:
            raise ValueError(f"idle_unload must be positive seconds or None, got {idle_unload}")
        self.path = path
        self.idle_unload = idle_unload
        self.cache_bytes = cache_bytes
        self.backend = backend
        with _gguf.open(path) as f:
            md = f.metadata
            if f.architecture != "clip":
                raise ModelFormatError(
                    f"{path} is not a projector (mmproj) GGUF: its architecture is {f.architecture!r}"
                )
            temporal = 2 if "v.patch_embd.weight.1" in f.tensors else 1
        proj = md.get("clip.vision.projector_type", md.get("clip.projector_type"))
        if proj != "qwen3vl_merger" or "clip.vision.patch_size" not in md:
            raise ModelFormatError(
                f"{path}: projector type {proj!r} is not supported (regolith runs Qwen3-VL's 'qwen3vl_merger')"
            )
        self.processor = ImageProcessor.from_metadata(md, temporal)
        self.out_dim = int(md["clip.vision.projection_dim"])
        self._encoder: Any = None
        self._lock = threading.Lock()
        self._last_used = 0.0
        self._timer: threading.Timer | None = None
        self._cache: OrderedDict[bytes, ImageEmbedding] = OrderedDict()
        self._cached_bytes = 0
        self.loads = 0
        """How many times the weights were loaded (the first image, then after each idle unload)."""

    @property
    def loaded(self) -> bool:
        """Whether the encoder's weights are in memory."""
        return self._encoder is not None

    def encode(self, image: Any) -> ImageEmbedding:
        """The embedding of ``image`` (anything :func:`load_image` takes), from the cache when the same
        pixels were encoded before. Raises :class:`regolith.ImageError` for an unusable image."""
        from . import _core

        pixels, grid = self.processor(load_image(image))
        digest = hashlib.sha256(np.array(grid, np.int64).tobytes() + pixels.tobytes()).digest()
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None:
                self._cache.move_to_end(digest)
                self._touch()
                return hit
            if self._encoder is None:
                self._encoder = _core.VisionEncoder(self.path, backend=self.backend)
                self.loads += 1
            emb = self._encoder.encode(pixels, np.array([grid], np.int64))
            out = ImageEmbedding(emb, grid, digest)
            self._cache[digest] = out
            self._cached_bytes += emb.nbytes
            while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._cached_bytes -= old.embeddings.nbytes
            self._touch()
            return out

    def unload(self) -> None:
        """Free the encoder's weights now (the next image loads them again); cached embeddings stay."""
        with self._lock:
            self._encoder = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _touch(self) -> None:
        self._last_used = time.monotonic()
        if self.idle_unload is not None and self._timer is None:
            self._arm(self.idle_unload)

    def _arm(self, delay: float) -> None:
        # the timer holds the tower weakly: a pending timer must not keep the weights alive
        self._timer = threading.Timer(delay, _expire, args=(weakref.ref(self),))
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            assert self.idle_unload is not None
            idle = time.monotonic() - self._last_used
            if idle >= self.idle_unload:
                self._encoder = None
                self._timer = None
            else:
                self._arm(self.idle_unload - idle)


def _expire(ref: weakref.ref[VisionTower]) -> None:
    tower = ref()
    if tower is not None:
        tower._expire()


def split_images(messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """Messages for the chat template, with every image content part replaced by ``{"type": "image"}``, and
    the image sources in order. Image parts: ``{"type": "image_url", "image_url": {"url": ...}}`` (or a
    plain ``"image_url": "..."``) and ``{"type": "image", "image": <path, bytes or PIL image>}``."""
    out: list[dict[str, Any]] = []
    sources: list[Any] = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, list):
            out.append(dict(m) if isinstance(m, Mapping) else m)
            continue
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "image_url":
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, Mapping) else url
                if not isinstance(url, str):
                    raise ImageError(f"messages[{i}].content[{j}]: image_url needs a 'url' string")
                sources.append(url)
            elif kind == "image":
                if part.get("image") is None:
                    raise ImageError(f"messages[{i}].content[{j}]: an image part needs an 'image' value")
                sources.append(part["image"])
            else:
                parts.append(part)
                continue
            parts.append({"type": "image"})
        out.append({**m, "content": parts})
    return out, sources


def flatten_images(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose content-part lists become strings (text joined, images as the placeholder), for
    templates that only print string content."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            text = "".join(
                IMAGE_PLACEHOLDER if p.get("type") == "image" else str(p.get("text") or "") for p in content
            )
            m = {**m, "content": text}
        out.append(dict(m))
    return out


def render_with_images(
    template: Any, messages: Sequence[Mapping[str, Any]], n_images: int, **kwargs: Any
) -> str:
    """``template.render(messages, **kwargs)`` for messages from :func:`split_images`; a template that does
    not place one :data:`IMAGE_PLACEHOLDER` per image part (one that prints only string content) renders
    the messages flattened by :func:`flatten_images` instead."""
    text = template.render(messages, **kwargs)
    if n_images and text.count(IMAGE_PLACEHOLDER) != n_images:
        text = template.render(flatten_images(messages), **kwargs)
    return text
