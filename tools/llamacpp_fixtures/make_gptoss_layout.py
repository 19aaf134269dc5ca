"""Record llama.cpp's gpt-oss GGUF layout for the tiny test checkpoints.

Usage (from the repository root, in the test virtual environment)::

    python tools/llamacpp_fixtures/make_gptoss_layout.py [--llama-cpp DIR]

For every checkpoint in ``tests.llamacpp_layout.GPTOSS_VARIANTS`` this saves the tiny model
(``tests/dense_models.py``: ``save_tiny_checkpoint("gptoss", ...)`` for float experts,
``save_tiny_mxfp4_checkpoint`` for experts in MXFP4 blocks and scales as the released checkpoints hold them),
runs llama.cpp's own ``convert_hf_to_gguf.py --outtype f32`` on it in a subprocess and writes
``tests/fixtures/llamacpp/<name>.json`` (``tests/llamacpp_layout.py``): every metadata key and value and
every tensor's name, shape, ggml type and the sha256 of its float32 values (MXFP4 tensors dequantized by
gguf-py).

One patch makes llama.cpp's converter accept a tiny checkpoint, as it accepts the released ones: llama.cpp
identifies a BPE pre-tokenizer by hashing its output on a fixed text, and the tiny tokenizer (gpt-oss'
o200k regex over a 36-merge vocabulary) has no known hash, so the subprocess answers ``gpt-4o``, which is
what llama.cpp answers for gpt-oss' tokenizer. Hyper-parameters come through transformers' ``AutoConfig``,
as they do for a real conversion.

Default llama.cpp: the copy vendored in the llama-cpp-python 0.3.36 sdist under /work/ref. Its gguf-py goes
first on sys.path inside the subprocess only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.llamacpp_fixtures.make_qwen4exp_layout import DEFAULT_LLAMA_CPP, dump_layout

# Runs inside the subprocess: argv = [llama_cpp_dir, model_dir, out_file].
_RUNNER = r"""
import sys
llama_cpp, model_dir, out_file = sys.argv[1:4]
sys.path[:0] = [llama_cpp + "/gguf-py", llama_cpp]
import conversion.base as base

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-4o"
sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outfile", out_file, "--outtype", "f32"]
import runpy
runpy.run_path(llama_cpp + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def convert_layout(llama_cpp: Path, model_dir: Path, out: Path, name: str) -> dict:
    """Run llama.cpp's converter (``_RUNNER``) on ``model_dir`` into ``out`` in a subprocess and return the
    file's layout; exits with the converter's output when it fails."""
    from tests.llamacpp_layout import gguf_layout

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(llama_cpp), str(model_dir), str(out)],
        env=env,
        check=False,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"llama.cpp's converter failed on {name}")
    return gguf_layout(out)


def save_checkpoint(experts: str, path: Path, seed: int, overrides: dict) -> Path:
    """The tiny gpt-oss checkpoint of a ``GPTOSS_VARIANTS`` entry."""
    from tests.dense_models import save_tiny_checkpoint, save_tiny_mxfp4_checkpoint

    if experts == "mxfp4":
        return save_tiny_mxfp4_checkpoint(path, seed, **overrides)
    return save_tiny_checkpoint("gptoss", path, seed, **overrides)


def make_fixture(name: str, experts: str, seed: int, overrides: dict, llama_cpp: Path, work: Path) -> dict:
    model_dir = save_checkpoint(experts, work / name, seed, overrides)
    layout = convert_layout(llama_cpp, model_dir, work / f"{name}.gguf", name)
    layout["source"] = {
        "checkpoint": name,
        "experts": experts,
        "seed": seed,
        "overrides": overrides,
        "converter": f"{llama_cpp}/convert_hf_to_gguf.py --outtype f32",
    }
    return layout


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--llama-cpp", type=Path, default=DEFAULT_LLAMA_CPP, help="llama.cpp source tree")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "llamacpp")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from tests.llamacpp_layout import GPTOSS_VARIANTS

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (experts, seed, overrides) in GPTOSS_VARIANTS.items():
            layout = make_fixture(name, experts, seed, overrides, args.llama_cpp, Path(tmp))
            path = args.out / f"{name}.json"
            path.write_text(dump_layout(layout))
            print(f"{path}: {len(layout['tensors'])} tensors, {len(layout['metadata'])} keys")


if __name__ == "__main__":
    main()
