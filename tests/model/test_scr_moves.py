"""Suffix cache reuse's move (``Window.append_moved``, ``prefill(scr=True)``): a moved token's first-layer key
and value (which depend on the token and its position alone) equal what evaluating the edited prompt afresh
gives them, for every cache type, on global and sliding-window layers, plain and YaRN RoPE; without an edit
``scr`` is the plain path bit for bit; a moved window is never stored in the prompt cache; the hybrid models
(qwen4exp, Qwen3.5, Qwen3-Next) move their attention rows and take the old end's recurrent state as
docs/cache.md says (the last token moved with its noted logits, a cache entry that fits preferred, the
tail read again). The plan step: tests/test_scr_plan.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import regolith
from regolith import state as rstate
from regolith.convert import convert
from regolith.errors import RegolithError
from regolith.generation import RECURRENT_TAIL, prefill
from regolith.scr import MIN_RUN
from tests.dense_models import save_tiny_checkpoint, tiny_config, tiny_model, write_gguf

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

# kv type -> how far a moved first-layer key may be from a fresh one: f32 rounding of the rotation; f16 and
# the 8-bit rows are stored again after it (one rounding step of their own, relative to the row's largest)
KEY_TOL = {"f32": 1e-5, "f16": 2e-3, "q8_0": 2e-2, "i8": 2e-2}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """qwen2 (global RoPE layers), gemma3 (layer 0 slides, base 10000; global layers base 100000), gpt-oss
    (YaRN, sliding layer 0 scaled as the global ones)."""
    root = tmp_path_factory.mktemp("scr")
    out = {arch: write_gguf(tiny_model(arch, 0), root / f"{arch}.gguf") for arch in ("qwen2", "gemma3")}
    # heads of 32, the q8_0 cache's block
    d32 = tiny_model("qwen2", 0, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    out["qwen2-d32"] = write_gguf(d32, root / "qwen2-d32.gguf")
    out["gptoss"] = convert(save_tiny_checkpoint("gptoss", root / "gptoss", 0), root / "gptoss.gguf", "f32")
    return out


def _tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 290, n).tolist()


# A conversation edited in its middle: the cached one is A + B + C, the new prompt A + X + B + C (X inserted)
A, B, C, X = _tokens(1, 20), _tokens(2, MIN_RUN + 8), _tokens(3, MIN_RUN + 4), _tokens(4, 11)
CACHED, EDITED = A + B + C, A + X + B + C


def _first_layer(window, tmp_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Layer 0's keys [n_head_kv][n][head_dim] and values [n_head_kv][head_dim][n] of an f32 cache, from
    the window's state file."""
    path = tmp_path / "state.rgs"
    rstate.save_window(window, path)
    head = rstate.read_header(path)
    _, _, offset, nbytes, _ = next(p for p in head.parts if p[0] == "kv" and p[1] == 0)
    raw = np.fromfile(path, dtype=np.float32, count=nbytes // 4, offset=offset)
    config = window._model.config
    kv, d, n = config["num_key_value_heads"], config["head_dim"], window.n_past
    return raw[: kv * n * d].reshape(kv, n, d), raw[kv * n * d :].reshape(kv, d, n)


@pytest.mark.parametrize("arch", ["qwen2", "gemma3", "gptoss"])
def test_a_moved_tokens_first_layer_is_what_the_edited_prompt_gives(files, arch, tmp_path):
    model = regolith.Model.load(files[arch], kv_type="f32")
    window = model.window(256)
    window.eval(CACHED, all_logits=False)
    _, reused = prefill(window, EDITED, scr=True)
    assert window.tokens == EDITED and reused == len(A) + len(B) + len(C) - 1
    assert window.moved_from == len(A) + len(X)
    assert window.n_evaluated == len(CACHED) + len(X) + 1  # the insertion and the prompt's last token
    fresh = model.window(256)
    fresh.eval(EDITED, all_logits=False)
    (k, v), (k0, v0) = _first_layer(window, tmp_path), _first_layer(fresh, tmp_path)
    moved = slice(len(A) + len(X), len(EDITED) - 1)
    assert np.abs(k[:, moved] - k0[:, moved]).max() <= KEY_TOL["f32"] * np.abs(k0).max()
    np.testing.assert_array_equal(v[..., moved], v0[..., moved])
    # the insertion and everything before it were evaluated: bit for bit
    np.testing.assert_array_equal(k[:, : moved.start], k0[:, : moved.start])


@pytest.mark.parametrize("kv_type", ["f16", "q8_0", "i8"])
def test_every_cache_type_moves(files, kv_type):
    """The moved keys of an f16 / q8_0 / i8 cache, read back through the logits: a one-layer check would need
    each type's layout, so the keys' effect is compared instead: the moved window's next-token logits equal
    those of an f32 cache moved the same way, within the cache type's own rounding."""
    logits, path = {}, files["qwen2-d32"]
    for t in ("f32", kv_type):
        model = regolith.Model.load(path, kv_type=t)
        window = model.window(256)
        window.eval(CACHED, all_logits=False)
        logits[t], _ = prefill(window, EDITED, scr=True)
        assert window.moved_from == len(A) + len(X)
    want = regolith.Model.load(path, kv_type=kv_type).window(256).eval(EDITED, all_logits=False)[0]
    ref = regolith.Model.load(path, kv_type="f32").window(256).eval(EDITED, all_logits=False)[0]
    # the type's rounding costs about as much on the moved path as on the plain one
    assert np.abs(logits[kv_type] - logits["f32"]).max() <= 4 * np.abs(want - ref).max() + 1e-4


def test_without_an_edit_scr_is_the_plain_path_bit_for_bit(files):
    model = regolith.Model.load(files["gemma3"], kv_type="f32")
    windows, logits = {}, {}
    for scr in (True, False):
        w = windows[scr] = model.window(256)
        w.eval(CACHED, all_logits=False)
        logits[scr], reused = prefill(w, CACHED + X, scr=scr)  # appended: the whole window is the prefix
        assert reused == len(CACHED)
    np.testing.assert_array_equal(logits[True], logits[False])
    assert windows[True].moved_from is None and windows[True].n_evaluated == windows[False].n_evaluated


def test_generation_with_scr_and_the_prompt_cache(files, tmp_path):
    """Model.start(scr=True) moves; the cache keeps the evaluated prefix but never the moved state, and a
    window cut back before the moved tokens is exact again."""
    model = regolith.Model.load(files["gptoss"], kv_type="f32")  # one with a tokenizer
    model.prompt_cache = regolith.PromptCache(tmp_path / "cache", 1 << 30, min_tokens=8)
    window = model.window(256)
    "".join(model.start(CACHED, window=window, max_tokens=2, temperature=0.0))
    stored = len(list((tmp_path / "cache").glob("*/*.rgs")))
    gen = model.start(EDITED, window=window, max_tokens=2, temperature=0.0, scr=True)
    "".join(gen)
    assert window.moved_from == len(A) + len(X)
    assert gen.stats.cached_tokens == len(A) + len(B) + len(C) - 1
    assert len(list((tmp_path / "cache").glob("*/*.rgs"))) == stored  # nothing moved was stored
    window.truncate(len(A) + len(X))
    assert window.moved_from is None


def _from_window_and_from_cache(model, tmp_path: Path, prefix: int, reused: int) -> None:
    """prefill(scr=True) on a fresh window whose prompt cache holds CACHED (and an unrelated entry) moves the
    entry's runs: the same logits, bit for bit, as from a window that held CACHED itself (``reused`` tokens);
    without scr the cache gives only the prefix (``prefix`` tokens: A, or none where a recurrent state cannot
    be cut back)."""
    cache = regolith.PromptCache(tmp_path / "cache", 1 << 30, min_tokens=8)
    for tokens in (_tokens(9, 60), CACHED):
        prefill(model.window(256), tokens, cache=cache)  # stored at the prompt's end, with its logits
    held = model.window(256)
    prefill(held, CACHED)
    want, want_reused = prefill(held, EDITED, scr=True)
    assert want_reused == reused
    fresh = model.window(256)
    got, reused = prefill(fresh, EDITED, cache=cache, scr=True)
    assert reused == want_reused and fresh.tokens == EDITED and fresh.moved_from == held.moved_from
    np.testing.assert_array_equal(got, want)
    assert cache.stats.tokens_saved == want_reused
    plain = model.window(256)
    _, reused = prefill(plain, EDITED, cache=cache)
    assert reused == prefix and plain.moved_from is None


def test_scr_moves_the_runs_of_a_prompt_cache_entry(files, tmp_path):
    # an attention-only model evaluates the prompt's last token: its logits see the edit
    _from_window_and_from_cache(
        regolith.Model.load(files["gemma3"], kv_type="f32"), tmp_path, len(A), len(CACHED) - 1
    )


def _part(window, kind: str, layer: int, tmp_path: Path) -> np.ndarray:
    """The bytes of the window's state part (kind, layer), from its state file."""
    path = tmp_path / "part.rgs"
    rstate.save_window(window, path)
    _, _, offset, nbytes, _ = next(p for p in rstate.read_header(path).parts if p[:2] == (kind, layer))
    return np.fromfile(path, dtype=np.uint8, count=nbytes, offset=offset)


def _layer_kv(window, layer: int, kv: int, d: int, tmp_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Layer ``layer``'s keys [kv][n][d] and values [kv][d][n] (an f32 cache of kv heads of d)."""
    path = tmp_path / "state.rgs"
    rstate.save_window(window, path)
    _, _, offset, nbytes, _ = next(p for p in rstate.read_header(path).parts if p[:2] == ("kv", layer))
    raw = np.fromfile(path, dtype=np.float32, count=nbytes // 4, offset=offset)
    n = window.n_past
    return raw[: kv * n * d].reshape(kv, n, d), raw[kv * n * d :].reshape(kv, d, n)


@pytest.mark.parametrize("arch", ["qwen3next", "qwen35moe"])
def test_hybrid_models_move_their_attention_rows_and_keep_the_recurrent_state(arch, tmp_path):
    """Qwen3-Next / Qwen3.5: the full-attention layer's rows move, each key's rotated quarter (M-RoPE's text
    positions alike on every axis) turned by the shift; the Gated DeltaNet layers end with the old end's
    state (the edited prompt ends as the old tokens do), so the window is approximate from the prefix on."""
    path = convert(save_tiny_checkpoint(arch, tmp_path / "hf", 0), tmp_path / "m.gguf", "f32")
    model = regolith.Model.load(path, kv_type="f32")
    c = tiny_config(arch)
    shape = (c.num_key_value_heads, c.head_dim)
    window = model.window(256)
    assert window.can_move
    prefill(window, CACHED)
    old_k, old_v = _layer_kv(window, 3, *shape, tmp_path)  # layer 3: full attention
    old_gdn = _part(window, "gdn", 0, tmp_path)
    _, reused = prefill(window, EDITED, scr=True)
    assert window.tokens == EDITED and reused == len(CACHED)  # the last token too: its logits were noted
    assert window.moved_from == len(A) and window.n_evaluated == len(CACHED) + len(X)
    k, v = _layer_kv(window, 3, *shape, tmp_path)
    rope = c.rope_parameters
    half = int(c.head_dim * rope["partial_rotary_factor"]) // 2
    angle = len(X) * rope["rope_theta"] ** (-np.arange(half) / half)
    cos, sin = np.cos(angle), np.sin(angle)
    src, dst = old_k[:, len(A) : len(CACHED) - 1], k[:, len(A) + len(X) : len(EDITED) - 1]
    want = src.copy()
    a, b = src[..., :half], src[..., half : 2 * half]
    want[..., :half], want[..., half : 2 * half] = a * cos - b * sin, b * cos + a * sin
    assert np.abs(dst - want).max() <= 1e-5 * np.abs(want).max()
    np.testing.assert_array_equal(
        v[..., len(A) + len(X) : len(EDITED) - 1], old_v[..., len(A) : len(CACHED) - 1]
    )
    np.testing.assert_array_equal(k[:, : len(A)], old_k[:, : len(A)])
    # the prompt's last token ends the old tokens too: with it, the recurrent layers took the old end's state
    np.testing.assert_array_equal(_part(window, "gdn", 0, tmp_path), old_gdn)
    _from_window_and_from_cache(model, tmp_path, 0, len(CACHED))  # the entry's recurrent state restored whole


def _rotated(x: np.ndarray, shift: int, half: int, theta: float) -> np.ndarray:
    """x's NEOX pairs (j, j + half) of its last axis turned by shift * theta^(-j / half)."""
    angle = shift * theta ** (-np.arange(half) / half)
    out, a, b = x.copy(), x[..., :half], x[..., half : 2 * half]
    out[..., :half], out[..., half : 2 * half] = (
        a * np.cos(angle) - b * np.sin(angle),
        b * np.cos(angle) + a * np.sin(angle),
    )
    return out


def test_qwen4exp_moves_its_qsa_rows_and_pools_the_blocks_again(tmp_path):
    """qwen4exp (Gated DeltaNet, QSA with PLE): a QSA layer's moved keys are the old ones turned by the shift,
    values and indexer keys as they were, positions shifted; a block of moved tokens pools to the old block's
    key turned by the shift (the edit and the prefix are whole blocks of 4 here, so the blocks line up)."""
    from tests.qwen4exp_models import save_tiny_model, tiny_text_config

    path = convert(save_tiny_model(tmp_path / "hf", 0), tmp_path / "q.gguf", "f32")
    model = regolith.Model.load(path, kv_type="f32")
    c = tiny_text_config()
    kv, d, idx, ratio = c.num_key_value_heads, c.head_dim, c.indexer_head_dim, c.indexer_compress_ratio
    half, theta = int(d * c.rope_parameters["partial_rotary_factor"]) // 2, c.rope_parameters["rope_theta"]
    x = _tokens(5, 12)
    cached, edited = A + B + C, A + x + B + C

    def qsa(window) -> dict[str, np.ndarray]:
        path = tmp_path / "state.rgs"
        rstate.save_window(window, path)
        _, _, offset, nbytes, _ = next(p for p in rstate.read_header(path).parts if p[:2] == ("qsa", 1))
        raw = np.fromfile(path, dtype=np.uint8, count=nbytes, offset=offset)
        n, out, at = window.n_past, {}, 0
        for name, count, dtype, shape in (
            ("k", n * kv * d, np.float32, (n, kv, d)),
            ("v", n * kv * d, np.float32, (n, kv, d)),
            ("index_k", n * idx, np.float32, (n, idx)),
            ("pos", n * 3, np.int64, (n, 3)),
            ("block_k", n // ratio * idx, np.float32, (n // ratio, idx)),
        ):
            size = count * np.dtype(dtype).itemsize
            out[name] = raw[at : at + size].view(dtype).reshape(shape)
            at += size
        return out

    window = model.window(256)
    prefill(window, cached)
    old = qsa(window)
    _, reused = prefill(window, edited, scr=True)
    assert window.tokens == edited and reused == len(cached) and window.moved_from == len(A)
    new = qsa(window)
    shift, n = len(x), len(cached) - len(A)
    moved, was = slice(len(A) + shift, len(A) + shift + n), slice(len(A), len(A) + n)
    want = _rotated(old["k"][was], shift, half, theta)
    assert np.abs(new["k"][moved] - want).max() <= 1e-5 * np.abs(want).max()
    for name in ("v", "index_k"):
        np.testing.assert_array_equal(new[name][moved], old[name][was])
    np.testing.assert_array_equal(new["pos"][moved], old["pos"][was] + shift)
    blocks = slice(moved.start // ratio, moved.stop // ratio)
    old_blocks = slice(was.start // ratio, was.start // ratio + blocks.stop - blocks.start)
    want = _rotated(old["block_k"][old_blocks], shift, half, theta)
    assert np.abs(new["block_k"][blocks] - want).max() <= 1e-5 * np.abs(want).max()


def test_bad_moves_are_refused_and_change_nothing(files):
    model = regolith.Model.load(files["qwen2"], kv_type="f32")
    window = model.window(64)
    window.eval(CACHED[:40], all_logits=False)
    snap = window.snapshot()
    with pytest.raises(ValueError, match="cannot move"):
        window.append_moved(snap, 30, 20)
    with pytest.raises(RegolithError, match="context overflow"):
        window.append_moved(snap, 0, 40)
    other = regolith.Model.load(files["gemma3"], kv_type="f32").window(64)
    other.eval(CACHED[:8], all_logits=False)
    with pytest.raises(RegolithError):
        window.append_moved(other.snapshot(), 0, 4)
    assert window.tokens == CACHED[:40] and window.moved_from is None


def test_the_logits_noted_after_a_prompt_hold_while_the_window_holds_its_tokens(files, tmp_path):
    """prefill notes the logits after the prompt (Window.end_logits): kept by a snapshot, a restore and a state
    file that stored them, stale once the window holds other tokens, valid again where it is cut back to them."""
    model = regolith.Model.load(files["gemma3"], kv_type="f32")
    window = model.window(256)
    logits, _ = prefill(window, CACHED)
    np.testing.assert_array_equal(window.end_logits(), logits)
    logits[:] = 0  # the caller's copy is its own
    want = window.end_logits().copy()
    assert want.any()
    snap = window.snapshot()
    window.eval(X, all_logits=False)
    assert window.end_logits() is None and window.snapshot().end_logits is None
    window.truncate(len(CACHED))  # an attention cache cut back: the state after CACHED again
    np.testing.assert_array_equal(window.end_logits(), want)
    window.reset()
    assert window.end_logits() is None
    window.restore(snap)
    np.testing.assert_array_equal(window.end_logits(), want)
    path = tmp_path / "s.rgs"
    rstate.save_window(window, path, logits=want)
    other = model.window(256)
    other.load(path)
    np.testing.assert_array_equal(other.end_logits(), want)
    rstate.save_window(window, path)
    other.load(path)
    assert other.end_logits() is None  # a file without logits: unknown, though the tokens are the same


def _hybrid(arch: str, tmp_path: Path):
    if arch == "qwen4exp":
        from tests.qwen4exp_models import save_tiny_model

        hf = save_tiny_model(tmp_path / "hf", 0)
    else:
        hf = save_tiny_checkpoint(arch, tmp_path / "hf", 0)
    return regolith.Model.load(convert(hf, tmp_path / "m.gguf", "f32"), kv_type="f32")


@pytest.mark.parametrize("arch", ["qwen3next", "qwen35moe", "qwen4exp"])
def test_a_recurrent_window_moves_the_prompts_last_token_where_its_logits_are_known(arch, tmp_path):
    """The edited prompt ends as the old one did, after whose last token prefill noted the logits: that token
    moves too (evaluating it would read it with a state that has read it already), the logits are the old
    prompt's and the recurrent layers end with the old end's state; nothing after the edit is evaluated."""
    model = _hybrid(arch, tmp_path)
    window = model.window(256)
    old_logits, _ = prefill(window, CACHED)
    old_gdn = _part(window, "gdn", 0, tmp_path)
    logits, reused = prefill(window, EDITED, scr=True)
    assert window.tokens == EDITED and reused == len(CACHED) and window.moved_from == len(A)
    assert window.n_evaluated == len(CACHED) + len(X)
    np.testing.assert_array_equal(logits, old_logits)
    np.testing.assert_array_equal(window.end_logits(), old_logits)
    np.testing.assert_array_equal(_part(window, "gdn", 0, tmp_path), old_gdn)


def test_a_recurrent_model_moves_the_cache_entry_its_state_fits(tmp_path):
    """A conversation's window holds the prompt and a reply, and the prompt cache the prompt's end (with its
    logits) and the reply's; the prompt comes again edited. The window's own tokens do not fit (its state has
    read the reply last), nor does the reply's entry: the prompt's entry does, and its runs move, the last
    token with them, as from a window that held the prompt alone."""
    model = _hybrid("qwen3next", tmp_path)
    cache = regolith.PromptCache(tmp_path / "cache", 1 << 30, min_tokens=8)
    window = model.window(256)
    old_logits, _ = prefill(window, CACHED, cache=cache)  # stored at the prompt's end, with the logits
    old_gdn = _part(window, "gdn", 0, tmp_path)
    window.eval(_tokens(6, 12), all_logits=False)
    assert cache.store(window)  # the reply's end: an entry extending the prompt's
    logits, reused = prefill(window, EDITED, cache=cache, scr=True)
    assert window.tokens == EDITED and reused == len(CACHED) and window.moved_from == len(A)
    np.testing.assert_array_equal(logits, old_logits)
    np.testing.assert_array_equal(_part(window, "gdn", 0, tmp_path), old_gdn)
    assert cache.stats.tokens_saved == len(CACHED)


def test_a_recurrent_window_whose_state_read_other_text_last_reads_the_prompts_tail_again(tmp_path):
    """The window holds a prompt and a reply; the prompt comes again edited, with no cache entry at its end.
    The old end's state has read the reply last, so it is taken after the last run cut back to leave the
    prompt's last RECURRENT_TAIL tokens, which are evaluated again: the logits and the recurrent state are
    those of exactly that procedure, step by step."""
    model = _hybrid("qwen3next", tmp_path)
    long = _tokens(7, 160)
    cached, edited = A + long, A + X + long
    window = model.window(256)
    prefill(window, cached)
    window.eval(_tokens(6, 12), all_logits=False)  # the reply
    snap = window.snapshot()
    logits, reused = prefill(window, edited, scr=True)
    moved = len(edited) - RECURRENT_TAIL - (len(A) + len(X))
    assert window.tokens == edited and reused == len(A) + moved and moved > 0
    assert window.n_evaluated == len(snap.tokens) + len(X) + RECURRENT_TAIL
    by_hand = model.window(256)
    by_hand.restore(snap)
    by_hand.truncate_attention(len(A))
    by_hand.eval(X, all_logits=False)
    by_hand.append_moved(snap, len(A), moved)
    by_hand.adopt_recurrent(snap)
    want = by_hand.eval(edited[len(A) + len(X) + moved :], all_logits=False)[0]
    np.testing.assert_array_equal(logits, want)
    np.testing.assert_array_equal(_part(window, "gdn", 0, tmp_path), _part(by_hand, "gdn", 0, tmp_path))
