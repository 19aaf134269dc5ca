"""qwen4_exp and Qwen3.5 MoE with images (regolith.Model with a projector) against transformers 5.24 in fp32.

A tiny random ``Qwen4ExpForConditionalGeneration`` or ``Qwen3_5MoeForConditionalGeneration``
(tests/qwen4exp_vision_models.py) is converted with
``regolith convert --mmproj`` (f32). The oracle's inputs are built the way transformers' Qwen3-VL processor
builds them (its image processor's pixels and grids, each ``<|image_pad|>`` repeated grid.prod() / merge^2
times, tokenized by the checkpoint's tokenizer); its logits must match regolith's to 1e-4 of their scale.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")
Image = pytest.importorskip("PIL.Image")

import regolith
from regolith.vision import ImageSpan

torch.set_num_threads(1)


def _image(h: int, w: int, seed: int):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module", params=["qwen4exp", "qwen35moe"])
def vl(request, tmp_path_factory):
    from regolith.convert import convert
    from tests.qwen4exp_vision_models import save_tiny_vl_model

    tmp = tmp_path_factory.mktemp(f"vl-{request.param}")
    ref = save_tiny_vl_model(tmp / "hf", 3, arch=request.param)
    convert(tmp / "hf", tmp / "m.gguf", "f32", mmproj=tmp / "mmproj.gguf")
    # the f32 cache computes what transformers computes (the default i8: tests/model/test_kv_cache_types.py)
    model = regolith.Model.load(tmp / "m.gguf", mmproj=tmp / "mmproj.gguf", n_ctx=256, kv_type="f32")
    return model, ref, tmp / "hf"


def _reference(ref, hf_dir, messages, images):
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = AutoTokenizer.from_pretrained(hf_dir)
    pixels = Qwen2VLImageProcessorPil.from_pretrained(hf_dir)(images, return_tensors="pt")
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    head, *rest = text.split("<|image_pad|>")
    text = head + "".join(
        "<|image_pad|>" * int(g.prod() // 4) + part
        for g, part in zip(pixels["image_grid_thw"], rest, strict=True)
    )
    ids = tok(text, return_tensors="pt")["input_ids"]
    image_id = json.loads((hf_dir / "config.json").read_text())["image_token_id"]
    with torch.no_grad():
        logits = ref(
            input_ids=ids,
            pixel_values=pixels["pixel_values"],
            image_grid_thw=pixels["image_grid_thw"],
            mm_token_type_ids=(ids == image_id).int(),
        ).logits[0]
    return ids[0].numpy(), logits.numpy().astype(np.float64)


def _check(got: np.ndarray, ref: np.ndarray) -> None:
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err <= 1e-4, f"relative error {err:.3g}"


@pytest.mark.parametrize("shapes", [[(37, 53)], [(37, 53), (20, 90)]], ids=["one_image", "two_images"])
def test_logits_match_transformers(vl, shapes):
    model, ref, hf_dir = vl
    images = [_image(h, w, i) for i, (h, w) in enumerate(shapes)]
    content = [{"type": "text", "text": "the fox "}]
    for img in images:
        content += [{"type": "image", "image": img}, {"type": "text", "text": " and the dog"}]
    messages = [{"role": "user", "content": content}]
    ref_ids, ref_logits = _reference(ref, hf_dir, messages, images)
    ids, spans = model.multimodal_prompt(messages)
    assert ids == ref_ids.tolist()
    w = model.window(256)
    w.attach_images(spans)
    _check(w.eval(ids), ref_logits)
    # uneven chunks cutting through the images give the same logits
    w.reset()
    w.attach_images(spans)
    parts, start = [], 0
    for n in (5, 9, 1, 30, len(ids)):
        if start < len(ids):
            parts.append(w.eval(ids[start : start + n]))
            start += n
    _check(np.concatenate(parts), ref_logits)


def test_decoding_after_an_image_continues_its_positions(vl):
    model, ref, hf_dir = vl
    img = _image(30, 70, 5)
    messages = [
        {"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "hi"}]}
    ]
    ref_ids, _ = _reference(ref, hf_dir, messages, [img])
    ids, spans = model.multimodal_prompt(messages)
    extra = [40, 41, 42]
    _, ref_logits = _reference_ids(ref, hf_dir, ref_ids, extra, [img])
    w = model.window(256)
    w.attach_images(spans)
    w.eval(ids)
    got = np.concatenate([w.eval([t]) for t in extra])
    _check(got, ref_logits[-len(extra) :])


def _reference_ids(ref, hf_dir, ids, extra, images):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    pixels = Qwen2VLImageProcessorPil.from_pretrained(hf_dir)(images, return_tensors="pt")
    full = torch.tensor([*ids.tolist(), *extra])[None]
    image_id = json.loads((hf_dir / "config.json").read_text())["image_token_id"]
    with torch.no_grad():
        logits = ref(
            input_ids=full,
            pixel_values=pixels["pixel_values"],
            image_grid_thw=pixels["image_grid_thw"],
            mm_token_type_ids=(full == image_id).int(),
        ).logits[0]
    return full[0].numpy(), logits.numpy().astype(np.float64)


def test_the_plan_counts_the_vision_encoder_it_loads(vl):
    model, _, _ = vl
    model.vision.encode(_image(24, 24, 3))
    assert model.vision.loaded
    assert model.plan.sizes.vision_bytes == model.vision._encoder.weight_bytes > 0
    rows = {name: size for name, size, _ in model.plan.rows()}
    assert rows["vision encoder"] == model.plan.sizes.vision_bytes
    assert model.plan.total_bytes == sum(rows.values())


def test_chat_with_images_reuses_the_prefix_only_for_the_same_image(vl):
    model, _, _ = vl
    a, b = _image(24, 24, 7), _image(24, 24, 8)

    def messages(img):
        return [{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "?"}]}]

    ids, spans = model.multimodal_prompt(messages(a))
    _, spans_b = model.multimodal_prompt(messages(b))
    first = "".join(model.chat(messages(a), max_tokens=3, temperature=0, stream=True))
    w = model.window(256)
    gen = model.start(ids, window=w, images=spans, max_tokens=3, temperature=0)
    assert "".join(gen) == first
    # A prompt continuing what the window holds, the same image in it: all of it is reused ...
    more = [*ids, *gen.tokens, *model.tokenize("?", add_special=False)]
    again = model.start(more, window=w, images=spans, max_tokens=3, temperature=0)
    "".join(again)
    assert again.stats.cached_tokens == len(ids) + len(gen.tokens) - 1 > spans[0].end
    # ... the same token ids with another image: nothing from the image on
    other = model.start(more, window=w, images=spans_b, max_tokens=3, temperature=0)
    "".join(other)
    assert other.stats.cached_tokens <= spans_b[0].start


def test_text_after_an_image_turn_drops_the_image_tokens(vl, tmp_path):
    model, _, _ = vl
    w = model.window(256)
    msg = [{"role": "user", "content": [{"type": "image", "image": _image(16, 16, 9)}]}]
    ids, spans = model.multimodal_prompt(msg)
    w.attach_images(spans)
    w.eval(ids)
    w.attach_images([])
    assert w.n_past == spans[0].start
    w.attach_images(spans)
    w.eval(ids[w.n_past :])
    with pytest.raises(regolith.SessionError, match="holding images"):
        w.save(tmp_path / "state.rgs")


def test_vision_weights_load_on_first_image_and_unload_when_idle(vl):
    import time

    _, _, hf_dir = vl
    tower = regolith.vision.VisionTower(
        str(hf_dir.parent / "mmproj.gguf"), idle_unload=0.2, cache_bytes=1 << 20
    )
    assert not tower.loaded
    img = _image(16, 40, 11)
    e1 = tower.encode(img)
    assert tower.loaded and tower.loads == 1
    assert tower.encode(img.copy()) is e1  # cached by content
    deadline = time.monotonic() + 5
    while tower.loaded and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not tower.loaded
    e2 = tower.encode(_image(16, 40, 12))
    assert tower.loaded and tower.loads == 2 and e2.digest != e1.digest
    assert tower.encode(img) is e1  # still cached after the unload


def test_embedding_cache_is_bounded(vl):
    model, _, hf_dir = vl
    one = model.vision.encode(_image(16, 16, 20)).embeddings.nbytes
    tower = regolith.vision.VisionTower(
        str(hf_dir.parent / "mmproj.gguf"), idle_unload=None, cache_bytes=2 * one
    )
    first = tower.encode(_image(16, 16, 20))
    tower.encode(_image(16, 16, 21))
    tower.encode(_image(16, 16, 22))
    assert tower.encode(_image(16, 16, 20)) is not first
    assert isinstance(first, regolith.vision.ImageEmbedding) and ImageSpan(0, first, 2).n_tokens == 4


def test_model_without_projector_refuses_images(vl):
    model, _, _ = vl
    plain = regolith.Model.load(model.path)
    msg = [{"role": "user", "content": [{"type": "image", "image": _image(16, 16, 1)}]}]
    with pytest.raises(regolith.ImageError, match="model has no vision support"):
        plain.chat(msg, max_tokens=1)
