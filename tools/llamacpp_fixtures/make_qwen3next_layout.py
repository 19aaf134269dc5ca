"""Record llama.cpp's qwen3next (Qwen3-Next) GGUF layout for the tiny test checkpoints.

Usage (from the repository root, in the test virtual environment)::

    python tools/llamacpp_fixtures/make_qwen3next_layout.py [--llama-cpp DIR]

For every checkpoint in ``tests.llamacpp_layout.QWEN3NEXT_VARIANTS`` this saves the tiny model
(``tests/dense_models.py``; the MTP variant as the released checkpoints are: its ``mtp.*`` tensors in
``model-mtp.safetensors``, config.json without ``layer_types`` nor ``mtp_num_hidden_layers``), runs
llama.cpp's own ``convert_hf_to_gguf.py --outtype f32`` on it in a subprocess and writes
``tests/fixtures/llamacpp/<name>.json`` (``tests/llamacpp_layout.py``), with make_qwen4exp_layout.py's two
patches for a tiny checkpoint: hparams from config.json as written, and the BPE pre-tokenizer answered as
``qwen35`` (the tiny tokenizer's regex).

A checkpoint without ``mtp.*`` tensors is converted with ``--no-mtp``: llama.cpp's Qwen3-Next converter
otherwise asserts that it found an MTP head (``_QwenMtpMixin``: config.json has no ``mtp_num_hidden_layers``,
so it counts the ``mtp.layers.*`` tensors); regolith writes such a checkpoint without one, as ``--no-mtp``
does.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.llamacpp_fixtures.make_qwen4exp_layout import DEFAULT_LLAMA_CPP, convert_layout, dump_layout


def make_fixture(name: str, arch: str, seed: int, overrides: dict, llama_cpp: Path, work: Path) -> dict:
    from tests.dense_models import save_tiny_checkpoint

    model_dir = save_tiny_checkpoint(arch, work / name, seed, **overrides)
    extra = [] if overrides.get("mtp") else ["--no-mtp"]
    layout = convert_layout(llama_cpp, model_dir, work / f"{name}.gguf", name, extra)
    layout["source"] = {
        "checkpoint": name,
        "architecture": arch,
        "seed": seed,
        "overrides": overrides,
        "converter": f"{llama_cpp}/convert_hf_to_gguf.py --outtype f32 {' '.join(extra)}".rstrip(),
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
    from tests.llamacpp_layout import QWEN3NEXT_VARIANTS

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (arch, seed, overrides) in QWEN3NEXT_VARIANTS.items():
            layout = make_fixture(name, arch, seed, overrides, args.llama_cpp, Path(tmp))
            path = args.out / f"{name}.json"
            path.write_text(dump_layout(layout))
            print(f"{path}: {len(layout['tensors'])} tensors, {len(layout['metadata'])} keys")


if __name__ == "__main__":
    main()
