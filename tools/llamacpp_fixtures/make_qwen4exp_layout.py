"""Record llama.cpp's qwen4exp GGUF layout for the tiny test checkpoints.

Usage (from the repository root, in the test virtual environment)::

    python tools/llamacpp_fixtures/make_qwen4exp_layout.py [--llama-cpp DIR]

For every checkpoint in ``tests.llamacpp_layout.QWEN4EXP_VARIANTS`` this saves the tiny model
(``tests/qwen4exp_models.py``), runs llama.cpp's own ``convert_hf_to_gguf.py --outtype f32`` on it in a
subprocess, and writes ``tests/fixtures/llamacpp/<name>.json``: every metadata key and value and every
tensor's name, shape, ggml type and float32 checksum (``tests/llamacpp_layout.py``).

Three patches make llama.cpp's converter accept a tiny checkpoint, as real checkpoints would be accepted:
- config.json ``layer_types``: ``indexed_attention`` (what transformers writes) -> ``full_attention`` (what
  the real checkpoints say and what llama.cpp's converter looks for);
- hparams come from config.json as written, not from transformers' ``AutoConfig``: with transformers 5.24
  installed, llama.cpp's converter loads the config through it, which maps ``full_attention`` back to
  ``indexed_attention``, so ``attention.compress_ratios`` comes out all 0 and llama.cpp's graph runs dense
  attention on every QSA layer. Reading config.json gives the layout llama.cpp's converter intends
  (the ratio on every full-attention layer), which is what regolith writes;
- the BPE pre-tokenizer check: llama.cpp identifies a tokenizer by hashing its output on a fixed text, and
  a freshly built tokenizer has no known hash; the tiny tokenizer uses Qwen3.5's pre-tokenizer regex, so the
  subprocess answers ``qwen35`` as it would for the real tokenizer.

Default llama.cpp: the copy vendored in the llama-cpp-python 0.3.36 sdist under /work/ref. Its gguf-py goes
first on sys.path inside the subprocess only (it knows MODEL_ARCH.QWEN4EXP; the installed gguf may not).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LLAMA_CPP = Path("/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp")

# Runs inside the subprocess: argv = [llama_cpp_dir, model_dir, out_file, *more converter arguments].
_RUNNER = r"""
import sys
llama_cpp, model_dir, out_file = sys.argv[1:4]
more = sys.argv[4:]
sys.path[:0] = [llama_cpp + "/gguf-py", llama_cpp]
import json
import conversion.base as base

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
# read config.json itself, not AutoConfig(...).to_dict(): transformers maps full_attention back to
# indexed_attention, and llama.cpp's converter then writes compress_ratios of 0 (dense) for every layer
base.ModelBase.load_hparams = staticmethod(
    lambda dir_model, is_mistral_format: json.loads((dir_model / "config.json").read_text()))
sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outfile", out_file, "--outtype", "f32", *more]
import runpy
runpy.run_path(llama_cpp + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def _patch_config(model_dir: Path) -> None:
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    cfg = config.get("text_config", config)
    cfg["layer_types"] = ["full_attention" if t == "indexed_attention" else t for t in cfg["layer_types"]]
    path.write_text(json.dumps(config, indent=2) + "\n")


def convert_layout(
    llama_cpp: Path, model_dir: Path, out: Path, name: str, extra_args: Sequence[str] = ()
) -> dict:
    """Run llama.cpp's converter (``_RUNNER``, with ``extra_args`` after ``--outtype f32``) on ``model_dir``
    into ``out`` in a subprocess and return the file's layout (tests/llamacpp_layout.py); exits with its
    output when it fails."""
    from tests.llamacpp_layout import gguf_layout

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(llama_cpp), str(model_dir), str(out), *extra_args],
        env=env,
        check=False,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"llama.cpp's converter failed on {name}")
    return gguf_layout(out)


def make_fixture(name: str, seed: int, overrides: dict, llama_cpp: Path, work: Path) -> dict:
    from tests.qwen4exp_models import save_tiny_model

    model_dir = save_tiny_model(work / name, seed, **overrides)
    patched = work / "patched" / name
    shutil.copytree(model_dir, patched)
    _patch_config(patched)
    layout = convert_layout(llama_cpp, patched, work / f"{name}.gguf", name)
    layout["source"] = {
        "checkpoint": name,
        "seed": seed,
        "overrides": overrides,
        "converter": f"{llama_cpp}/convert_hf_to_gguf.py --outtype f32",
    }
    return layout


def dump_layout(layout: dict) -> str:
    """JSON with one metadata key or one tensor per line (diffs stay readable)."""
    lines = ["{", f' "source": {json.dumps(layout["source"])},', ' "metadata": {']
    items = list(layout["metadata"].items())
    for i, (k, v) in enumerate(items):
        lines.append(f"  {json.dumps(k)}: {json.dumps(v)}" + ("," if i + 1 < len(items) else ""))
    lines.append(" },")
    lines.append(' "tensors": [')
    for i, t in enumerate(layout["tensors"]):
        lines.append(f"  {json.dumps(t)}" + ("," if i + 1 < len(layout["tensors"]) else ""))
    lines.append(" ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--llama-cpp", type=Path, default=DEFAULT_LLAMA_CPP, help="llama.cpp source tree")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "llamacpp")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(1)
    from tests.llamacpp_layout import QWEN4EXP_VARIANTS

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (seed, overrides) in QWEN4EXP_VARIANTS.items():
            layout = make_fixture(name, seed, overrides, args.llama_cpp, Path(tmp))
            path = args.out / f"{name}.json"
            path.write_text(dump_layout(layout))
            print(f"{path}: {len(layout['tensors'])} tensors, {len(layout['metadata'])} keys")


if __name__ == "__main__":
    main()
