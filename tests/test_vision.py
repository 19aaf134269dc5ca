"""regolith.vision: preprocessing against transformers' Qwen2-VL image processor (PIL backend, the class
qwen4_exp's processor config names), image decoding errors, M-RoPE positions against transformers'
get_rope_index."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image")

from regolith import ImageError
from regolith.vision import (
    ImageEmbedding,
    ImageProcessor,
    ImageSpan,
    load_image,
    mrope_positions,
    split_images,
)

SETTINGS = [
    # (patch, merge, mean, std, min_pixels, max_pixels)
    (16, 2, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), 65536, 16777216),
    (14, 2, (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711), 3136, 200704),
    (4, 2, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), 256, 4096),
]
SIZES = [(448, 448), (1, 1), (3, 7), (31, 1900), (2000, 29), (480, 640), (97, 131)]  # (h, w)


def _reference(settings):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    patch, merge, mean, std, lo, hi = settings
    return Qwen2VLImageProcessorPil(
        patch_size=patch,
        merge_size=merge,
        temporal_patch_size=2,
        image_mean=list(mean),
        image_std=list(std),
        size={"shortest_edge": lo, "longest_edge": hi},
    )


def _ours(settings) -> ImageProcessor:
    patch, merge, mean, std, lo, hi = settings
    return ImageProcessor(patch, merge, 2, mean, std, lo, hi)


def _image(h: int, w: int, mode: str = "RGB", seed: int = 0):
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    data = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
    return Image.fromarray(data[..., 0] if channels == 1 else data, mode)


@pytest.mark.parametrize("settings", SETTINGS, ids=["qwen4exp", "clip_norm", "tiny_patches"])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_preprocessing_matches_transformers(settings, size):
    pytest.importorskip("transformers")
    img = _image(*size, seed=size[0] * 7 + size[1])
    ref = _reference(settings)([img], return_tensors="np")
    pixels, grid = _ours(settings)(img)
    assert list(grid) == ref["image_grid_thw"][0].tolist()
    assert pixels.dtype == np.float32
    np.testing.assert_array_equal(pixels, ref["pixel_values"])


@pytest.mark.parametrize("mode", ["RGBA", "L"])
def test_alpha_and_grey_images_match_transformers(mode):
    pytest.importorskip("transformers")
    img = _image(50, 70, mode, seed=3)
    ref = _reference(SETTINGS[2])([img], return_tensors="np")
    pixels, _ = _ours(SETTINGS[2])(img)
    np.testing.assert_array_equal(pixels, ref["pixel_values"])


def _png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def test_sources_decode_alike(tmp_path):
    img = _image(9, 13)
    data = _png(img)
    path = tmp_path / "x.png"
    path.write_bytes(data)
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    for src in (img, data, path, str(path), url):
        assert np.array_equal(np.asarray(load_image(src).convert("RGB")), np.asarray(img))


def test_corrupt_image_bytes():
    with pytest.raises(
        ImageError, match="cannot decode the image: 9 bytes that are not a known image format"
    ):
        load_image(b"not a png")
    data = _png(_image(64, 64))
    with pytest.raises(ImageError, match="PNG image is corrupt or truncated"):
        load_image(data[: len(data) // 2])


def test_unsupported_format():
    buf = io.BytesIO()
    _image(8, 8).save(buf, "TIFF")
    with pytest.raises(ImageError, match="unsupported image format TIFF"):
        load_image(buf.getvalue())


def test_oversized_image_is_refused_before_decoding():
    # a 20000 x 20000 PNG that compresses to a few hundred kilobytes: a decompression bomb
    buf = io.BytesIO()
    Image.new("L", (20000, 20000)).save(buf, "PNG")
    with pytest.raises(ImageError, match="has 400000000 pixels, more than the 50000000 allowed"):
        load_image(buf.getvalue())
    with pytest.raises(ImageError, match="more than the 100 allowed"):
        load_image(_image(11, 11), max_pixels=100)


def test_extreme_aspect_ratio():
    with pytest.raises(ImageError, match="aspect ratio 201.0 exceeds 200"):
        _ours(SETTINGS[0])(_image(1, 201))


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("https://example.com/cat.png", "remote image URLs are not fetched"),
        ("data:text/plain;base64,aGk=", "must look like data:image/<type>;base64"),
        ("data:image/png;base64,@@@", "invalid base64"),
        ("/nonexistent/cat.png", "cannot read image file"),
        (42, "not int"),
    ],
)
def test_bad_sources(source, message):
    with pytest.raises(ImageError, match=message):
        load_image(source)


def test_split_images_keeps_text_and_orders_sources():
    img = _image(4, 4)
    msgs = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "a"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                {"type": "image", "image": img},
            ],
        },
    ]
    plain, sources = split_images(msgs)
    assert plain[0] == msgs[0]
    assert plain[1]["content"] == [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "image"}]
    assert sources[0] == "data:image/png;base64,AA==" and sources[1] is img


@pytest.mark.parametrize("grids", [[(1, 6, 10)], [(1, 4, 4), (1, 10, 2)], [(1, 2, 8), (1, 8, 2), (1, 6, 6)]])
def test_mrope_positions_match_transformers_get_rope_index(grids):
    torch = pytest.importorskip("torch")
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpModel

    merge, pad = 2, 9
    ids: list[int] = [1, 2, 3]
    spans = []
    for k, g in enumerate(grids):
        emb = ImageEmbedding(np.zeros((g[1] * g[2] // 4, 1), np.float32), g, bytes([k]))
        spans.append(ImageSpan(len(ids), emb, merge))
        ids += [pad] * spans[-1].n_tokens + [4, 5][: k + 1]

    class Stub:
        class config:
            class vision_config:
                spatial_merge_size = merge

        get_vision_position_ids = Qwen4ExpModel.get_vision_position_ids

    input_ids = torch.tensor([ids])
    ref, _ = Qwen4ExpModel.get_rope_index(
        Stub(), input_ids, (input_ids == pad).int(), image_grid_thw=torch.tensor(grids)
    )
    ref = ref[:, 0].T.numpy()
    np.testing.assert_array_equal(mrope_positions(spans, 0, len(ids)), ref)
    np.testing.assert_array_equal(mrope_positions(spans, 5, 7), ref[5:12])
