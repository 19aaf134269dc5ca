"""Record what llama.cpp writes and reads for split GGUFs, for tests/test_gguf_split.py and
tests/model/test_llamacpp_parity.py.

Usage (from the repository root), with llama.cpp built from the llama-cpp-python 0.3.36 sdist's vendored copy
(``cmake -S vendor/llama.cpp -B BUILD -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF && cmake --build BUILD --target
llama-gguf-split llama``, ~30 min on 2 cores) and that sdist's ``llama_cpp`` package on PYTHONPATH (it needs
``diskcache``) pointed at the build (``LLAMA_CPP_LIB_PATH=BUILD/bin``)::

    python tools/llamacpp_fixtures/make_split_fixture.py BUILD/bin/llama-gguf-split

It writes ``tests/fixtures/llamacpp/split.json``:

- ``gguf_split``: the sha256 of every shard ``llama-gguf-split --split`` writes for the bundled demo model,
  by tensor count (``--split-max-tensors 100``) and by size (``--split-max-size 10M``);
- ``merge``: ``llama-gguf-split --merge`` run on regolith's shards of the demo (by size): its tensor count and
  the sha256 of its tensor data section (what llama.cpp read from the shards);

and ``tests/fixtures/llamacpp/qwen4exp-split-logits.npz``: llama.cpp's logits for the prompt of
``tests.model.test_llamacpp_parity`` on regolith's shards (``SPLIT_TENSORS`` tensors each) of the
``SPLIT_CASE`` tiny model, converted by ``regolith convert --outtype f32``, and the shards' sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import regolith
from regolith import gguf_split
from regolith.convert import convert
from regolith.models import DEFAULT_MODEL, resolve_model
from tests.model.test_llamacpp_parity import (
    CASES,
    SEED,
    SPLIT_CASE,
    SPLIT_FIXTURE,
    SPLIT_TENSORS,
    case_prompt,
)
from tests.qwen4exp_models import save_tiny_model

FIXTURE = ROOT / "tests" / "fixtures" / "llamacpp" / "split.json"
SPLITS = {"tensors": ["--split-max-tensors", "100"], "size": ["--split-max-size", "10M"]}


def sha256(path: Path, start: int = 0) -> str:
    with open(path, "rb") as f:
        f.seek(start)
        return hashlib.sha256(f.read()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf_split", type=Path, help="llama.cpp's llama-gguf-split binary")
    args = ap.parse_args()
    demo = resolve_model(DEFAULT_MODEL)
    out: dict = {"source": "llama.cpp vendored in llama-cpp-python 0.3.36", "gguf_split": {}}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        for mode, options in SPLITS.items():
            subprocess.run(
                [args.gguf_split, "--split", *options, demo, t / mode], check=True, capture_output=True
            )
            out["gguf_split"][mode] = {p.name: sha256(p) for p in sorted(t.glob(f"{mode}-*.gguf"))}
        with regolith.gguf.open(demo) as src:
            ours = gguf_split.write_split(src, t / "ours" / "demo.gguf", max_size=10**7)
        merged = t / "merged.gguf"
        subprocess.run([args.gguf_split, "--merge", ours[0], merged], check=True, capture_output=True)
        with regolith.gguf.open(merged) as f:
            data = min(info.offset for info in f.tensors.values())
            out["merge"] = {"tensors": len(f.tensors), "tensor_data_sha256": sha256(merged, data)}

        import llama_cpp

        hf = save_tiny_model(t / "hf", SEED, **CASES[SPLIT_CASE])
        with regolith.gguf.open(convert(hf, t / "m.gguf", "f32")) as src:
            shards = gguf_split.write_split(src, t / "split" / "m.gguf", max_tensors=SPLIT_TENSORS)
        ids = case_prompt()
        llm = llama_cpp.Llama(
            model_path=str(shards[0]), n_ctx=64, n_batch=64, logits_all=True, verbose=False, n_threads=2,
            type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
        )  # fmt: skip
        llm.eval(ids.tolist())
        np.savez_compressed(
            SPLIT_FIXTURE,
            ids=ids,
            logits=np.array(llm.scores[: len(ids)], dtype=np.float32),
            shards=np.array([f"{p.name} {sha256(p)}" for p in shards]),
        )
    FIXTURE.write_text(json.dumps(out, indent=2) + "\n")
    print("wrote", FIXTURE, "and", SPLIT_FIXTURE)


if __name__ == "__main__":
    main()
