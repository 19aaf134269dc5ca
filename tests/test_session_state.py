"""Window and session state files: continuing after a load gives the logits continuing without saving gave, bit
for bit (tiny qwen4exp: Gated DeltaNet, QSA and PLE states; real gemma3: an f16 KV cache); corrupt, truncated,
wrong-version and wrong-model files raise SessionError; a process killed mid-save leaves the file it was
replacing intact. In-memory snapshots (Window.snapshot / restore) restore bit for bit too.
"""

from __future__ import annotations

import importlib.util
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import regolith
from regolith import Session, SessionError, _core
from regolith import state as rstate
from regolith.models import KNOWN_MODELS, resolve_model

OVERRIDES = {"indexer_n_heads": 8, "output_gate_type": "sigmoid", "indexer_budget": 256}
GREEDY = {"temperature": 0.0}
ROOT = Path(__file__).resolve().parents[1]


def _tiny(tmp: Path, seed: int) -> regolith.Model:
    from regolith.convert import convert
    from tests.qwen4exp_models import save_tiny_model

    save_tiny_model(tmp / f"hf{seed}", seed, **OVERRIDES)
    return regolith.Model.load(convert(tmp / f"hf{seed}", tmp / f"tiny{seed}.gguf", "f32"), n_ctx=256)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _tiny(tmp_path_factory.mktemp("state"), 3)


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """The same architecture and shapes with other weights."""
    return _tiny(tmp_path_factory.mktemp("state_other"), 4)


@pytest.fixture(scope="module")
def gemma():
    if importlib.util.find_spec(KNOWN_MODELS["gemma3-270m"].package) is None:
        pytest.skip("the gemma3-270m weights package is not installed")
    return regolith.Model.load(resolve_model("gemma3-270m"), n_ctx=1024)


def _ids(model: regolith.Model, n: int, seed: int = 0) -> list[int]:
    vocab = model.config["vocab_size"]
    return np.random.default_rng(seed).integers(3, min(vocab, 5000), n).tolist()


def _continue(w: regolith.Window, ids: list[int]) -> list[np.ndarray]:
    """Logits of a chunk and then of three single tokens (prefill and decode paths)."""
    return [w.eval(ids[:-3]), *(w.eval([t]) for t in ids[-3:])]


def _assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


# ---- CRC32C --------------------------------------------------------------------------------------------------


def _crc32c_bitwise(data: bytes) -> int:
    """CRC32C from its definition (RFC 3720 B.4): reflected polynomial 0x82F63B78, init and final XOR ~0."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_crc32c_matches_rfc3720_and_bitwise_definition():
    # RFC 3720 B.4 test vectors and the catalogue check value.
    assert _core.crc32c(bytes(32)) == 0x8A9136AA
    assert _core.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert _core.crc32c(bytes(range(32))) == 0x46DD794E
    assert _core.crc32c(b"123456789") == 0xE3069283
    data = np.random.default_rng(1).integers(0, 256, 3000, dtype=np.uint8).tobytes()
    for lo, hi in [(0, 0), (0, 1), (1, 9), (3, 1000), (5, 3000)]:
        assert _core.crc32c(data[lo:hi]) == _crc32c_bitwise(data[lo:hi])
    assert _core.crc32c(data[100:], _core.crc32c(data[:100])) == _core.crc32c(data)
    assert zlib.crc32(b"123456789") != _core.crc32c(b"123456789")  # not CRC-32/IEEE


# ---- exactness -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_name", ["tiny", pytest.param("gemma", marks=pytest.mark.real_weights)])
def test_continuing_after_load_is_bit_identical(model_name, request, tmp_path):
    model = request.getfixturevalue(model_name)
    ids = _ids(model, 120)
    w = model.window(200)
    w.eval(ids[:45])
    w.eval(ids[45:70])  # uneven chunks: the saved state is whatever evaluation left
    path = tmp_path / "w.rgs"
    stats = w.save(path)
    assert stats.bytes == path.stat().st_size and stats.seconds > 0
    want = _continue(w, ids[70:])

    fresh = model.window(200)
    fresh.eval(_ids(model, 30, seed=9))  # loading replaces whatever the window held
    fresh.load(path)
    assert fresh.tokens == ids[:70] and fresh.n_past == 70
    _assert_same(_continue(fresh, ids[70:]), want)


@pytest.mark.parametrize("model_name", ["tiny", pytest.param("gemma", marks=pytest.mark.real_weights)])
def test_delta_on_a_parent_restores_bit_identical(model_name, request, tmp_path):
    model = request.getfixturevalue(model_name)
    ids = _ids(model, 100, seed=2)
    w = model.window(128)
    w.eval(ids[:37])
    rstate.save_window(w, tmp_path / "parent.rgs")
    w.eval(ids[37:61])
    rstate.save_window(w, tmp_path / "child.rgs", start=37)
    want = _continue(w, ids[61:])

    whole = rstate.read_header(tmp_path / "parent.rgs")
    delta = rstate.read_header(tmp_path / "child.rgs")
    assert (delta.start, delta.n) == (37, 61)
    for (kind, _, _, nbytes, _), (pkind, _, _, pbytes, _) in zip(delta.parts, whole.parts, strict=True):
        assert kind == pkind
        if kind in ("kv", "qsa"):  # positional parts hold only the delta's 24 rows
            assert nbytes < pbytes
        else:  # recurrent states are whole
            assert nbytes == pbytes

    fresh = model.window(128)
    with pytest.raises(SessionError, match="continues a state of its first 37"):
        rstate.load_window(fresh, tmp_path / "child.rgs")
    assert fresh.n_past == 0
    rstate.load_window(fresh, tmp_path / "parent.rgs", whole=False)
    rstate.load_window(fresh, tmp_path / "child.rgs")
    _assert_same(_continue(fresh, ids[61:]), want)


def test_logits_and_meta_round_trip(tiny, tmp_path):
    w = tiny.window()
    logits = w.eval(_ids(tiny, 20), all_logits=False)[0]
    rstate.save_window(w, tmp_path / "w.rgs", logits=logits, meta=b'{"x": 1}')
    head = rstate.read_header(tmp_path / "w.rgs")
    assert head.has_logits and head.meta == b'{"x": 1}' and head.version == rstate.FORMAT_VERSION
    _, back = rstate.load_window(tiny.window(), tmp_path / "w.rgs")
    np.testing.assert_array_equal(back, logits)


# ---- bad files -----------------------------------------------------------------------------------------------


@pytest.fixture
def saved(tiny, tmp_path):
    w = tiny.window()
    w.eval(_ids(tiny, 50))
    path = tmp_path / "w.rgs"
    w.save(path)
    return path, path.read_bytes()


def _load_fails(model: regolith.Model, path: Path, match: str) -> regolith.Window:
    w = model.window()
    with pytest.raises(SessionError, match=match):
        w.load(path)
    return w


def test_a_flipped_byte_in_any_part_or_the_header_is_detected(tiny, saved):
    path, data = saved
    head = rstate.read_header(path)
    spots = [(offset + nbytes // 2, "CRC32C") for _, _, offset, nbytes, _ in head.parts]
    spots += [(40, "corrupt header"), (110, "corrupt header")]  # the fingerprint, a token id
    for spot, match in spots:
        bad = bytearray(data)
        bad[spot] ^= 0x40
        path.write_bytes(bytes(bad))
        w = _load_fails(tiny, path, match)
        assert w.n_past == 0 and w.tokens == []  # reset, and usable
        w.eval([5, 6])


def test_truncated_files_are_rejected(tiny, saved):
    path, data = saved
    for n in [0, 5, 60, 4096, len(data) // 2, len(data) - 1]:
        path.write_bytes(data[:n])
        _load_fails(tiny, path, "truncated|not a regolith")
    path.write_bytes(data + b"\0" * 4096)
    _load_fails(tiny, path, "header says")


def test_other_versions_and_non_state_files_are_rejected(tiny, saved, tmp_path):
    path, data = saved
    path.write_bytes(data[:8] + struct.pack("<I", 1) + data[12:])
    _load_fails(tiny, path, "version 1 state file; this regolith reads versions 2 to 3")
    _load_fails(tiny, Path(tiny.path), "not a regolith window state file")
    with pytest.raises(FileNotFoundError):
        tiny.window().load(tmp_path / "missing.rgs")


@pytest.mark.real_weights
def test_another_models_state_is_rejected_and_the_window_kept(tiny, other, gemma, saved):
    path, _ = saved
    for model in (other, gemma):
        w = model.window(256)
        w.eval([7, 8, 9])
        with pytest.raises(SessionError, match="another model"):
            w.load(path)
        assert w.tokens == [7, 8, 9]


def test_a_state_longer_than_the_window_is_rejected(tiny, saved):
    path, _ = saved
    w = tiny.window(40)
    with pytest.raises(SessionError, match="at most 40"):
        w.load(path)


# ---- snapshots in memory -------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_name", ["tiny", pytest.param("gemma", marks=pytest.mark.real_weights)])
def test_a_snapshot_restores_bit_identical(model_name, request):
    model = request.getfixturevalue(model_name)
    ids = _ids(model, 90, seed=5)
    w = model.window(128)
    w.eval(ids[:33])
    w.eval(ids[33:50])
    snap = w.snapshot()
    assert snap.tokens == tuple(ids[:50]) and snap.nbytes > 0
    want = _continue(w, ids[50:])
    for _ in range(2):  # restored twice: a snapshot is not consumed
        w.restore(snap)
        assert w.tokens == ids[:50] and w.n_past == 50
        _assert_same(_continue(w, ids[50:]), want)
    fresh = model.window(128)
    fresh.restore(snap)
    _assert_same(_continue(fresh, ids[50:]), want)


@pytest.mark.real_weights
def test_a_snapshot_of_another_model_or_too_long_is_rejected(tiny, gemma):
    w = tiny.window(64)
    w.eval(_ids(tiny, 50))
    snap = w.snapshot()
    for window, match in ((gemma.window(64), "does not fit|state parts"), (tiny.window(40), "at most 40")):
        window.eval([7, 8, 9])
        with pytest.raises(SessionError, match=match):
            window.restore(snap)
        assert window.tokens == [] and window.n_past == 0  # reset, as the error says


# ---- sessions ------------------------------------------------------------------------------------------------


def test_a_loaded_session_continues_exactly(tiny, tmp_path):
    s = Session(tiny, system="be brief", max_tokens=6, **GREEDY)
    s.send("hello")
    s.save(tmp_path / "s.rgs")
    back = Session.load(tiny, tmp_path / "s.rgs", max_tokens=6, **GREEDY)
    held = back.window.tokens
    assert back.messages == s.messages and held == s.window.tokens
    before = back.window.n_evaluated
    gen = back.send("more", stream=True)
    reply = "".join(gen)
    assert reply == s.send("more")
    # Only the new turn's tokens were evaluated: the loaded window held the first turn.
    assert gen.prompt[: len(held)] == held and gen.stats.cached_tokens == len(held)
    assert back.window.n_evaluated - before == len(gen.prompt) - len(held) + max(len(gen.tokens) - 1, 0)


def test_a_window_file_is_not_a_session(tiny, saved):
    path, _ = saved
    with pytest.raises(SessionError, match="not a saved session"):
        Session.load(tiny, path)


# ---- kill -9 -------------------------------------------------------------------------------------------------

_SAVER = """
import sys, numpy as np, regolith
model = regolith.Model.load(sys.argv[1], n_ctx=256)
w = model.window()
w.eval(np.arange(3, int(sys.argv[3])))
w.save(sys.argv[2])
print("ready", flush=True)
while True:
    w.save(sys.argv[2])
"""


def test_kill_9_during_save_leaves_the_previous_file(tiny, tmp_path):
    target = tmp_path / "w.rgs"
    w = tiny.window()
    ids = list(range(3, 120))
    w.eval(ids)
    want = w.eval([9, 10])
    leftovers = 0
    # Kill at different moments until at least one kill has landed mid-save (a temporary file is left).
    for attempt in range(12):
        target.unlink(missing_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_SAVER), tiny.path, str(target), str(ids[-1] + 1)],
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(0.004 * attempt)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        tmps = list(tmp_path.glob(".w.rgs.*.tmp"))
        leftovers += len(tmps)
        fresh = tiny.window()
        fresh.load(target)
        np.testing.assert_array_equal(fresh.eval([9, 10]), want)
        for tmp in tmps:
            tmp.unlink()
        if leftovers and attempt >= 2:
            break
    assert leftovers > 0
