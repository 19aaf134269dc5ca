"""The engine fixture cases: what tools/engine_fixtures/record.py recorded on the pre-refactor build and
tests/test_engine_fixtures.py replays, defined once here so that the two cannot drift.

A case runs the engine through the public API (``Model.load``, ``Window.eval`` / ``truncate`` / ``checkpoint``
/ ``draft`` / ``save`` / ``load``, ``generate``, ``chat``, images) and returns named parts: float32 arrays
(logits or image embeddings, one row per token) or exact values (token ids, draft ids, text). ``digest``
turns parts into what tests/fixtures/engine/logits.json stores: per array row the SHA-256 of its float32
bytes and its first values; exact values as they are. ``compare`` lists the differences between two digests.

The models: the tiny qwen4exp GGUFs committed beside logits.json (``TINY_FILES``, built by record.py with
tests/qwen4exp_models.py and tests/qwen4exp_vision_models.py), the llama.cpp-quantized tiny files of
tests/fixtures/llamacpp, the bundled demo model and the real gemma3-270m / qwen2.5-coder-0.5b weights.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import regolith
from regolith import _core

__all__ = ["CASES", "FIXTURES", "LOGITS", "TINY_FILES", "Case", "compare", "digest"]

FIXTURES = Path(__file__).parent / "fixtures" / "engine"
LOGITS = FIXTURES / "logits.json"
LLAMACPP = Path(__file__).parent / "fixtures" / "llamacpp"
HEAD = 4  # values stored per row, for reading a mismatch

# The files record.py writes (``--regenerate-models``) and commits; what each is, for the reader.
TINY_FILES = {
    "tiny-mtp-f32.gguf": "default tiny qwen4exp (GDN, QSA, PLE, MoE: 6 experts + shared) with MTP, f32",
    "tiny-mtp-q8_0.gguf": "the same checkpoint, --outtype q8_0 (Q8_0, F16 where a row is not 32-divisible)",
    "tiny-mtp-q4_k.gguf": "the same checkpoint, --outtype q4_k (64-wide rows demote Q4_K to Q5_0, else F16)",
    "tiny-nople-q8_0.gguf": "no PLE (ple_layer_ids []), no MTP, other weights, q8_0",
    "tiny-vl-q8_0.gguf": "the text model of a tiny qwen4_exp vision-language checkpoint, q8_0",
    "tiny-vl-mmproj-f16.gguf": "its vision tower (qwen3vl_merger projector), f16",
    "tiny-vl-mmproj-f32.gguf": "its vision tower, f32",
}

Part = np.ndarray | list | str
Parts = dict[str, Part]


@dataclass(frozen=True)
class Case:
    """One recorded scenario. ``run(tmp)`` (``tmp``: an empty directory for state files and packs) returns
    its parts; ``group`` picks the test that replays it; ``model``: the known model whose weights package
    it needs (None: only files of this repository)."""

    name: str
    group: str
    run: Callable[[Path], Parts]
    model: str | None = None

    def missing(self) -> str | None:
        """Why the case cannot run here, or None."""
        if self.model is None:
            return None
        from regolith.models import KNOWN_MODELS

        package = KNOWN_MODELS[self.model].package
        if importlib.util.find_spec(package) is None:
            return f"the {self.model} weights package {package!r} is not installed"
        return None


# ---- digests -------------------------------------------------------------------------------------------------


def _value(x: np.float32) -> float:
    """A float32 as the shortest decimal that reads back as the same float32."""
    return float(np.format_float_positional(x, unique=True, trim="-"))


def digest(parts: Parts) -> dict[str, Any]:
    """The JSON form of a case's parts: arrays as their shape and per row [sha256 of the float32 bytes,
    first values]; anything else (ids, drafts, text) as ``{"value": ...}``."""
    out: dict[str, Any] = {}
    for name, part in parts.items():
        if isinstance(part, np.ndarray):
            if part.dtype != np.float32 or part.ndim != 2:
                raise TypeError(f"part {name!r}: expected a 2-D float32 array, got {part.dtype} {part.shape}")
            rows = np.ascontiguousarray(part)
            out[name] = {
                "shape": list(rows.shape),
                "rows": [
                    [hashlib.sha256(r.tobytes()).hexdigest(), [_value(v) for v in r[:HEAD]]] for r in rows
                ],
            }
        else:
            out[name] = {"value": part}
    return out


def compare(got: dict[str, Any], want: dict[str, Any], limit: int = 8) -> list[str]:
    """Differences between two digests, one line each: the part, the row and the first values got vs
    recorded (at most ``limit`` rows per part, then a count)."""
    lines: list[str] = []
    for name in sorted(set(got) | set(want)):
        if name not in got or name not in want:
            lines.append(f"part {name!r}: {'not recorded' if name not in want else 'not produced'}")
            continue
        g, w = got[name], want[name]
        if "value" in g or "value" in w:
            if g.get("value") != w.get("value"):
                lines.append(f"part {name!r}: got {g.get('value')!r}, recorded {w.get('value')!r}")
            continue
        if g["shape"] != w["shape"]:
            lines.append(f"part {name!r}: shape {g['shape']}, recorded {w['shape']}")
            continue
        bad = [i for i, (a, b) in enumerate(zip(g["rows"], w["rows"], strict=True)) if a[0] != b[0]]
        for i in bad[:limit]:
            lines.append(
                f"part {name!r} row {i}: first values got {g['rows'][i][1]}, recorded {w['rows'][i][1]}"
            )
        if len(bad) > limit:
            lines.append(f"part {name!r}: {len(bad) - limit} more rows of {len(g['rows'])} differ")
    return lines


# ---- inputs --------------------------------------------------------------------------------------------------


def _tiny_prompt(n: int = 40, vocab: int = 304, seed: int = 0) -> np.ndarray:
    """The tests' tiny-model prompt: random ids with an EOS (2) at 17, which resets the PLE n-grams."""
    ids = np.random.default_rng(seed).integers(3, vocab, n).astype(np.int32)
    ids[17] = 2
    return ids


TINY_PROMPT = _tiny_prompt()
DEMO_TEXT = '''import os


class Stack:
    """A last-in, first-out stack of items."""

    def __init__(self):
        self._items = []

    def push(self, item):
        self._items.append(item)

    def pop(self):
        if not self._items:
            raise IndexError("pop from an empty stack")
        return self._items.pop()

    def __len__(self):
        return len(self._items)
'''
DENSE_TEXT = (
    "The old lighthouse keeper climbed the spiral stairs every evening, counting each step aloud, "
    "because the sea had taught him that small habits keep a man steady."
)


def _image(h: int, w: int, seed: int):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def _arena_gb(path: Path, slots: int) -> float:
    """arena_gb holding ``slots`` expert slots of this model (a GGUF or a packed directory)."""
    from regolith import model_sizes
    from regolith import pack as pk

    packed = pk.open_packed(path) if pk.is_packed(path) else None
    with regolith.gguf.open(packed.dense if packed else path) as f:
        sizes = model_sizes.sizes_from_gguf(f.tensors, f.metadata, packed.manifest if packed else None)
    return slots * sizes.slot_bytes / 2**30


def _singles(w: regolith.Window, ids: Sequence[int]) -> np.ndarray:
    return np.concatenate([w.eval([int(t)]) for t in ids])


# ---- tiny qwen4exp -------------------------------------------------------------------------------------------


def _load_qwen4exp(*args: object, **kwargs: object) -> regolith.Model:
    """A qwen4exp model with the f32 attention cache its fixtures were recorded with (its default until the
    seed's i8 became it: tests/model/test_kv_cache_types.py checks the other cache types)."""
    return regolith.Model.load(*args, kv_type="f32", **kwargs)


def _tiny_cases(file: str, *, mtp: bool, exact: bool) -> list[Case]:
    path = FIXTURES / file
    ids = TINY_PROMPT
    stem = f"tiny/{file.removesuffix('.gguf')}"

    def whole(tmp: Path) -> Parts:
        return {"logits": _load_qwen4exp(path).window(64).eval(ids)}

    def chunks(tmp: Path) -> Parts:
        w = _load_qwen4exp(path).window(64)
        parts, start = [], 0
        for n in (7, 1, 13, 2, 17):
            parts.append(w.eval(ids[start : start + n]))
            start += n
        return {"logits": np.concatenate(parts)}

    def token_by_token(tmp: Path) -> Parts:
        return {"logits": _singles(_load_qwen4exp(path).window(64), ids[:12])}

    def rollback(tmp: Path) -> Parts:
        w = _load_qwen4exp(path).window(64)
        out: Parts = {"prompt_last": w.eval(ids, all_logits=False)}
        w.checkpoint()
        out["checkpointed"] = w.eval([11, 12, 13, 14, 15])
        w.truncate(len(ids) + 2)  # back 3 tokens, within the checkpointed evaluation
        out["after_rollback"] = w.eval([21, 22])
        w.truncate(30)  # outside any checkpoint: the window re-evaluates its first 30 tokens
        out["after_replay"] = w.eval([31, 32])
        return out

    def drafts(tmp: Path) -> Parts:
        w = _load_qwen4exp(path).window(64)
        w.eval(ids[:7], all_logits=False)
        w.eval(ids[7:39], all_logits=False)
        out: Parts = {"after_prompt": [w.draft(int(t), 4) for t in (ids[39], 5, 100, 2)]}
        w.eval(ids[39:])
        out["after_decode"] = [w.draft(int(t), 4) for t in (7, 250)]
        return out

    def streamed(model: regolith.Model) -> Parts:
        """A 13-token prefill, then one token at a time (the decode path, where the arena prefetches), the
        MTP head's drafts (its experts stream too), and the whole prompt at once (in waves of 3 experts)."""
        w = model.window(64)
        out: Parts = {"logits": np.concatenate([w.eval(ids[:13]), _singles(w, ids[13:])])}
        if mtp:
            out["drafts"] = [w.draft(int(t), 4) for t in (7, 250)]
        out["whole"] = model.window(64).eval(ids)
        return out

    def arena(tmp: Path) -> Parts:
        return streamed(_load_qwen4exp(path, arena_gb=_arena_gb(path, 3)))

    def packed(tmp: Path) -> Parts:
        from regolith import pack as pk

        src = pk.pack(path, tmp / "tiny.pack")
        return streamed(_load_qwen4exp(src, arena_gb=_arena_gb(src, 3)))

    def state(tmp: Path) -> Parts:
        model = _load_qwen4exp(path)
        w = model.window(64)
        w.eval(ids[:20])
        w.eval(ids[20:30])
        w.save(tmp / "w.rgs")
        fresh = model.window(64)
        fresh.eval(ids[:5])  # loading replaces whatever the window held
        fresh.load(tmp / "w.rgs")
        return {"logits": fresh.eval(ids[30:33])}

    def exact_activations(tmp: Path) -> Parts:
        before = _core.exact_activations()
        _core.set_exact_activations(True)
        try:
            return {"logits": _load_qwen4exp(path).window(64).eval(ids)}
        finally:
            _core.set_exact_activations(before)

    runs: list[Callable[[Path], Parts]] = [whole, chunks, token_by_token, rollback]
    runs += [drafts] if mtp else []
    runs += [arena, packed, state]
    runs += [exact_activations] if exact else []
    return [Case(f"{stem}/{f.__name__}", "tiny", f) for f in runs]


# ---- llama.cpp-quantized tiny qwen4exp ---------------------------------------------------------------------


def _llamacpp_case(file: str) -> Case:
    path = LLAMACPP / file
    ids = np.random.default_rng(1).integers(3, 304, 28).astype(np.int32)

    def run(tmp: Path) -> Parts:
        w = _load_qwen4exp(path).window(64)
        return {"prompt": w.eval(ids[:24]), "decode": _singles(w, ids[24:])}

    return Case(f"llamacpp/{file.removesuffix('.gguf')}/prompt_and_decode", "llamacpp", run)


# ---- the bundled demo model ------------------------------------------------------------------------------


def _demo_ids() -> list[int]:
    ids = _load_qwen4exp().tokenize(DEMO_TEXT)
    if len(ids) < 56:
        raise AssertionError(f"DEMO_TEXT is {len(ids)} tokens; the demo cases need 56")
    return ids[:56]


def _demo_prompt_and_decode(model: regolith.Model, ids: list[int]) -> Parts:
    w = model.window(128)
    return {"ids": ids, "prompt": w.eval(ids[:48]), "decode": _singles(w, ids[48:56])}


def _demo_cases() -> list[Case]:
    def prompt_and_decode(tmp: Path) -> Parts:
        return _demo_prompt_and_decode(_load_qwen4exp(), _demo_ids())

    def generate(tmp: Path) -> Parts:
        from regolith.speculative import Speculation

        prompt = "class Stack:\n    def __init__(self):\n"
        plain = _load_qwen4exp().generate(prompt, max_tokens=16, temperature=0, speculative=False)
        # MTP drafts of fixed length (no cost gate, which times the machine): verification and rollback
        spec = Speculation(drafters=("mtp",), gate=False, draft_max=3)
        drafted = _load_qwen4exp().generate(prompt, max_tokens=16, temperature=0, speculative=spec)
        return {"greedy": plain, "greedy_mtp_drafts": drafted}

    def drafts(tmp: Path) -> Parts:
        ids = _demo_ids()
        w = _load_qwen4exp().window(128)
        w.eval(ids[:48], all_logits=False)
        out: Parts = {"after_prompt": [w.draft(int(t), 4) for t in (ids[48], ids[49], 28)]}
        w.eval(ids[48:52])
        out["after_decode"] = [w.draft(int(t), 4) for t in (ids[52], 483)]
        return out

    def arena(tmp: Path) -> Parts:
        return _demo_prompt_and_decode(_load_qwen4exp(arena_gb=0.004, n_ctx=1024), _demo_ids())

    return [Case(f"demo/{f.__name__}", "demo", f) for f in (prompt_and_decode, generate, drafts, arena)]


# ---- real dense models -------------------------------------------------------------------------------------


def _dense_cases(name: str) -> list[Case]:
    def prompt_and_decode(kv_type: str) -> Callable[[Path], Parts]:
        def run(tmp: Path) -> Parts:
            model = regolith.Model.load(name)
            ids = model.tokenize(DENSE_TEXT)[:24]
            if kv_type == "f16":  # the default cache, through the public Window
                w = model.window(64)
                return {"ids": ids, "prompt": w.eval(ids[:20]), "decode": _singles(w, ids[20:])}
            cw = model._core.new_window(64, kv_type)  # the f32 cache is a core window option
            arr = np.asarray(ids, np.int32)
            prompt = cw.eval(arr[:20])
            decode = np.concatenate([cw.eval(arr[i : i + 1]) for i in range(20, 24)])
            return {"ids": ids, "prompt": prompt, "decode": decode}

        run.__name__ = f"prompt_and_decode_kv_{kv_type}"
        return run

    def long_prompt(tmp: Path) -> Parts:
        """600 tokens: past the 512-token prefill chunk and gemma3's 512-token sliding window."""
        model = regolith.Model.load(name)
        ids = np.random.default_rng(2).integers(3, 5000, 600).astype(np.int32)
        return {"last": model.window(640).eval(ids, all_logits=False)}

    runs = [prompt_and_decode("f16"), prompt_and_decode("f32"), long_prompt]
    return [Case(f"dense/{name}/{f.__name__}", "dense", f, model=name) for f in runs]


# ---- vision ---------------------------------------------------------------------------------------------


VL_TEXT = FIXTURES / "tiny-vl-q8_0.gguf"
IMAGES = ((37, 53, 0), (20, 90, 1))  # (height, width, seed)


def _vision_messages(images: list[Any]) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = [{"type": "text", "text": "the fox "}]
    for img in images:
        content += [{"type": "image", "image": img}, {"type": "text", "text": " and the dog"}]
    return [{"role": "user", "content": content}]


def _vision_cases() -> list[Case]:
    def embeddings(precision: str) -> Callable[[Path], Parts]:
        def run(tmp: Path) -> Parts:
            from regolith.vision import VisionTower

            tower = VisionTower(str(FIXTURES / f"tiny-vl-mmproj-{precision}.gguf"), idle_unload=None)
            out: Parts = {}
            for i, (h, w, seed) in enumerate(IMAGES):
                emb = tower.encode(_image(h, w, seed))
                out[f"image{i}_grid"] = list(emb.grid)
                out[f"image{i}"] = emb.embeddings
            return out

        run.__name__ = f"embeddings_{precision}"
        return run

    def multimodal_logits(tmp: Path) -> Parts:
        model = _load_qwen4exp(VL_TEXT, mmproj=FIXTURES / "tiny-vl-mmproj-f32.gguf", n_ctx=256)
        ids, spans = model.multimodal_prompt(_vision_messages([_image(h, w, s) for h, w, s in IMAGES]))
        w = model.window(256)
        w.attach_images(spans)
        out: Parts = {"ids": ids, "prompt": w.eval(ids), "decode": _singles(w, [40, 41, 42])}
        w.reset()
        w.attach_images(spans)
        parts, start = [], 0
        for n in (5, 9, 1, 30, len(ids)):  # uneven chunks cutting through the images
            if start < len(ids):
                parts.append(w.eval(ids[start : start + n]))
                start += n
        out["chunks"] = np.concatenate(parts)
        return out

    def chat(tmp: Path) -> Parts:
        model = _load_qwen4exp(VL_TEXT, mmproj=FIXTURES / "tiny-vl-mmproj-f16.gguf", n_ctx=256)
        messages = _vision_messages([_image(30, 70, 5)])
        return {"reply": model.chat(messages, max_tokens=8, temperature=0, speculative=False)}

    runs = [embeddings("f32"), embeddings("f16"), multimodal_logits, chat]
    return [Case(f"vision/tiny-vl/{f.__name__}", "vision", f) for f in runs]


CASES: dict[str, Case] = {
    c.name: c
    for c in [
        *_tiny_cases("tiny-mtp-f32.gguf", mtp=True, exact=False),
        *_tiny_cases("tiny-mtp-q8_0.gguf", mtp=True, exact=False),
        *_tiny_cases("tiny-mtp-q4_k.gguf", mtp=True, exact=True),
        *_tiny_cases("tiny-nople-q8_0.gguf", mtp=False, exact=False),
        _llamacpp_case("qwen4exp-iq3_s.gguf"),
        _llamacpp_case("qwen4exp-iq4_xs.gguf"),
        *_demo_cases(),
        *_dense_cases("gemma3-270m"),
        *_dense_cases("qwen2.5-coder-0.5b"),
        *_vision_cases(),
    ]
}
