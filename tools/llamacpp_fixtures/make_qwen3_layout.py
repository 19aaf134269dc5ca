"""Record llama.cpp's qwen3 / qwen3moe, qwen35moe (Qwen3.5 MoE) and qwen3next (Qwen3-Next) GGUF layouts for the
tiny test checkpoints.

Usage (from the repository root, in the test virtual environment)::

    python tools/llamacpp_fixtures/make_qwen3_layout.py [qwen3 | qwen35moe | qwen3next ...] [--llama-cpp DIR]

For every checkpoint in ``tests.llamacpp_layout``'s ``QWEN3_VARIANTS``, ``QWEN35MOE_VARIANTS`` and
``QWEN3NEXT_VARIANTS`` (the families named, all by default) this saves the tiny model (``tests/dense_models.py``;
a Qwen3.5 MTP variant with its ``mtp.*`` tensors in ``model-mtp.safetensors``, a Qwen3-Next one as the released
checkpoints are: those tensors, and config.json without ``layer_types`` nor ``mtp_num_hidden_layers``), runs
llama.cpp's own ``convert_hf_to_gguf.py --outtype f32`` on it in a subprocess and writes
``tests/fixtures/llamacpp/<name>.json`` (``tests/llamacpp_layout.py``), as make_qwen4exp_layout.py does, with its
two patches for a tiny checkpoint: hparams from config.json as written, and the BPE pre-tokenizer answered as
``qwen35`` (the tiny tokenizer's regex). The qwen3 layouts need ``sentencepiece`` (llama.cpp's Qwen3 vocab path).

A Qwen3.5 / Qwen3-Next checkpoint without ``mtp.*`` tensors is converted with ``--no-mtp``: llama.cpp's converter
otherwise asserts that it found an MTP head (``_QwenMtpMixin``); regolith writes such a checkpoint without one, as
``--no-mtp`` does.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.llamacpp_fixtures.make_qwen4exp_layout import DEFAULT_LLAMA_CPP, convert_layout, dump_layout

FAMILIES = {"qwen3": "QWEN3_VARIANTS", "qwen35moe": "QWEN35MOE_VARIANTS", "qwen3next": "QWEN3NEXT_VARIANTS"}


def make_fixture(name: str, arch: str, seed: int, overrides: dict, llama_cpp: Path, work: Path) -> dict:
    from tests.dense_models import save_tiny_checkpoint

    model_dir = save_tiny_checkpoint(arch, work / name, seed, **overrides)
    hybrid = arch in ("qwen35moe", "qwen3next")
    has_mtp = overrides.get("mtp_num_hidden_layers") or overrides.get("mtp")
    extra = ["--no-mtp"] if hybrid and not has_mtp else []
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
    parser.add_argument("families", nargs="*", help=f"of {', '.join(FAMILIES)} (default: all)")
    parser.add_argument("--llama-cpp", type=Path, default=DEFAULT_LLAMA_CPP, help="llama.cpp source tree")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "llamacpp")
    args = parser.parse_args()
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}")

    import torch

    torch.set_num_threads(1)
    import tests.llamacpp_layout as layouts

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families or list(FAMILIES):
            for name, (arch, seed, overrides) in getattr(layouts, FAMILIES[family]).items():
                layout = make_fixture(name, arch, seed, overrides, args.llama_cpp, Path(tmp))
                path = args.out / f"{name}.json"
                path.write_text(dump_layout(layout))
                print(f"{path}: {len(layout['tensors'])} tensors, {len(layout['metadata'])} keys")


if __name__ == "__main__":
    main()
