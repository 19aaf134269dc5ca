"""Record llama.cpp's tokenization of the tokenizer corpus, for tests/test_tokenizer.py.

Usage (from the repository root, with llama-cpp-python installed and the gemma and qwen model packages)::

    python tools/llamacpp_fixtures/make_tokenizer_fixtures.py [VARIANT ...]

For every variant in ``tests.tokenizer_corpus.VARIANTS`` (the ones named, all by default; a known model, and
metadata overrides applied through llama.cpp's ``kv_overrides``, e.g. ``qwen2-pre-gpt4o``: Qwen2.5-Coder's
byte-level BPE vocabulary split by llama.cpp's ``gpt-4o`` pre-tokenizer, gpt-oss') this loads the vocabulary
alone (``vocab_only=True``) and writes
``tests/fixtures/llamacpp/tokenizer-<variant>.json``:

- ``vocab``: llama.cpp's view of the vocabulary: size, BOS/EOS ids, add_bos/add_eos, the end-of-generation
  ids, the control ids (as ``[start, stop)`` runs), and ``token_to_piece(id, special=True)`` for a sample of
  ids (base64);
- ``cases``: for every corpus string its ids from ``llama_tokenize`` in each of ``MODES``
  (add_special, parse_special), and for each of those id lists ``llama_detokenize`` with
  (remove_special=False, unparse_special=True) and (remove_special=True, unparse_special=False), as
  base64 bytes (llama.cpp returns bytes; they need not be valid UTF-8);
- for ``qwen2`` also ``unicode16``: the ids of each ``UNICODE16`` string (no BOS, special tokens parsed)
  from llama.cpp and from transformers' tokenizer for the same GGUF (``AutoTokenizer`` with
  ``gguf_file``), which disagree there.
"""

from __future__ import annotations

import base64
import ctypes
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from regolith.models import resolve_model
from tests.tokenizer_corpus import CORPUS, MODES, UNICODE16, VARIANTS

OUT = ROOT / "tests" / "fixtures" / "llamacpp"
PIECE_SAMPLE_STRIDE = 997


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _tokenize(llama_cpp, vocab, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
    n = len(text) + 8
    while True:
        buf = (llama_cpp.llama_token * n)()
        got = llama_cpp.llama_tokenize(vocab, text, len(text), buf, n, add_special, parse_special)
        if got >= 0:
            return list(buf[:got])
        n = -got


def _detokenize(llama_cpp, vocab, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    n = 64 + 16 * len(ids)
    while True:
        buf = ctypes.create_string_buffer(n)
        got = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, n, remove_special, unparse_special)
        if got >= 0:
            return buf.raw[:got]
        n = -got


def _piece(llama_cpp, vocab, token: int) -> bytes:
    n = 64
    while True:
        buf = ctypes.create_string_buffer(n)
        got = llama_cpp.llama_token_to_piece(vocab, token, buf, n, 0, True)
        if got >= 0:
            return buf.raw[:got]
        n = -got


def _runs(ids: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for i in ids:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


def record(model: str, overrides: dict[str, str | bool]) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(
        str(resolve_model(model)), vocab_only=True, verbose=False, kv_overrides=dict(overrides) or None
    )
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    sample = sorted(set(range(0, n_vocab, PIECE_SAMPLE_STRIDE)) | set(range(min(n_vocab, 600))))
    info = {
        "n_tokens": n_vocab,
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
        "eog": [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)],
        "control_runs": _runs([i for i in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, i)]),
        "pieces": {str(i): _b64(_piece(llama_cpp, vocab, i)) for i in sample},
    }
    cases = []
    for text in CORPUS:
        raw = text.encode("utf-8")
        ids = [_tokenize(llama_cpp, vocab, raw, a, p) for a, p in MODES]
        detok = [
            [
                _b64(_detokenize(llama_cpp, vocab, x, False, True)),
                _b64(_detokenize(llama_cpp, vocab, x, True, False)),
            ]
            for x in ids
        ]
        cases.append({"text": text, "ids": ids, "detok": detok})
    data = {
        "generator": "tools/llamacpp_fixtures/make_tokenizer_fixtures.py",
        "llama_cpp_python": llama_cpp.__version__,
        "model": model,
        "overrides": overrides,
        "vocab": info,
        "cases": cases,
    }
    if model == "qwen2.5-coder-0.5b" and not overrides:
        data["unicode16"] = _unicode16(llama_cpp, vocab, resolve_model(model))
    return data


def _unicode16(llama_cpp, vocab, path: Path) -> list[dict]:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return [
        {
            "text": text,
            "llama_cpp": _tokenize(llama_cpp, vocab, text.encode("utf-8"), False, True),
            "transformers": hf.encode(text, add_special_tokens=False),
        }
        for text in UNICODE16
    ]


def main() -> None:
    names = sys.argv[1:] or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names:
        model, overrides = VARIANTS[name]
        data = record(model, overrides)
        path = OUT / f"tokenizer-{name}.json"
        path.write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
