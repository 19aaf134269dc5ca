"""Weights out of training, and the Hugging Face checkpoint directory that ``regolith convert`` reads.

``write_shards`` (on the GPU machine, torch + safetensors only) writes a state dict as safetensors shards of at
most ``limit`` bytes: matrices as fp16, vectors as fp32, integer buffers as they are. ``main`` (here) reads those
shards and writes HF_DIR: ``config.json`` (model_type ``qwen4_exp_text``, architectures
``Qwen4ExpForCausalLM``, ``mtp_num_hidden_layers`` 1), ``model.safetensors`` (fp32, transformers' parameter
names, the ``mtp.*`` head included unless ``--no-mtp``) and the tokenizer files from corpus.py's output.

Usage: ``python -m tools.train_demo.export SHARDS_DIR HF_DIR --data DIR --config config.json [--no-mtp]``
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SHARD_LIMIT = 15 * 2**20


def write_shards(state: dict[str, torch.Tensor], out: Path, limit: int = SHARD_LIMIT) -> list[Path]:
    """Write ``state`` as ``model-0000N.safetensors`` files of at most ``limit`` bytes each; returns them."""
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in state.items():
        t = t.detach().cpu()
        if t.is_floating_point():
            t = t.to(torch.float16 if t.ndim >= 2 else torch.float32)
        t = t.contiguous()
        n = t.numel() * t.element_size()
        if n > limit:
            raise ValueError(f"{name} has {n} bytes, more than one shard ({limit})")
        if size + n > limit:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += n
    paths = []
    for i, shard in enumerate(shards):
        p = out / f"model-{i + 1:05d}.safetensors"
        save_file(shard, str(p))
        paths.append(p)
    return paths


def read_shards(src: Path) -> dict[str, torch.Tensor]:
    """The state dict from ``write_shards``' files, floats as fp32."""
    state: dict[str, torch.Tensor] = {}
    for p in sorted(src.glob("model-*.safetensors")):
        state.update(load_file(str(p)))
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def write_hf_dir(
    state: dict[str, torch.Tensor], out: Path, data: Path, config: dict, mtp: bool = True
) -> Path:
    """A Hugging Face checkpoint directory for ``state``; returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    if not mtp:
        state = {k: v for k, v in state.items() if not k.startswith("mtp.")}
        config = {k: v for k, v in config.items() if k != "mtp_num_hidden_layers"}
    save_file(
        {k: v.contiguous() for k, v in state.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(data / name, out / name)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shards", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--data", type=Path, required=True, help="corpus.py's output (tokenizer files)")
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--no-mtp", action="store_true", help="leave the mtp.* tensors out")
    args = ap.parse_args(argv)
    config = json.loads(args.config.read_text())
    out = write_hf_dir(read_shards(args.shards), args.out, args.data, config, mtp=not args.no_mtp)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
