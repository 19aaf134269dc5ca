"""Record the engine's CPU outputs before the Backend refactor, for tests/test_engine_fixtures.py.

The refactor moves every op of the C++ core behind a Backend interface and must keep the CPU logits
bit-identical. This script runs every case of tests/engine_cases.py (the tiny qwen4exp models whole, in
uneven chunks, token by token, through checkpointed rollback and re-evaluation, MTP drafts, a 3-slot expert
arena from the GGUF and from a ``regolith pack`` directory, a saved and reloaded state, exact activations;
the llama.cpp IQ3_S / IQ4_XS files; the bundled demo model with greedy generation and a 4 MiB arena;
gemma3-270m and qwen2.5-coder-0.5b with f16 and f32 KV caches and a 600-token prompt; a tiny
vision-language model's image embeddings and multimodal logits) once per CPU kernel set in
``regolith._core.available_isas()``, and writes ``tests/fixtures/engine/logits.json``: per ISA, per case,
per part the shape and for every row the SHA-256 of its float32 bytes and its first 4 values (to read a
mismatch); token ids, draft ids and generated text as they are.

It must be run with the pre-refactor build (commit 3ca5084): the fixture is the oracle, and recording it
with the build under test would make the test pass whatever the build computes. It refuses to overwrite a
logits.json recorded by another ``_core`` binary unless given ``--force``. From the repository root, with
the pre-refactor build importable (here installed in /work/old_regolith; ``regolith.__file__`` is printed)::

    OMP_NUM_THREADS=1 PYTHONPATH=/work/old_regolith python tools/engine_fixtures/record.py

``--group GROUP`` re-records one group of cases (``dense``, ...) with the build under test, into the existing
file, after a change meant to alter their numerics; ``rerecorded`` in the file names that build. So far:
``dense`` and ``llamacpp`` at issue 18's two changes: the bias term of Q4_1 / Q5_1 / Q2_K / Q4_K / Q5_K
products on the quantized activations' sums, and the activations of the integer-scale types (k-quants,
i-quants) quantized per 128 elements instead of 256. The real gemma3 / qwen2 files have Q4_K and Q6_K rows,
the llama.cpp files IQ3_S / IQ4_XS ones; the other groups' files have none, and did not change a bit.

It takes about 4 minutes on 2 cores, 3 of them for the scalar kernels' 600-token prompts.
``--regenerate-models`` first rebuilds the tiny GGUFs of tests/fixtures/engine (``TINY_FILES``; needs torch,
transformers and the converter) from tests/qwen4exp_models.py and tests/qwen4exp_vision_models.py. They
are committed, so the replay depends neither on torch nor on the converter; regenerating them invalidates
logits.json, which then has to be recorded again with the pre-refactor build. ``--out`` writes elsewhere
(for a determinism check), ``--isa`` records only the named kernel sets.

What the recording showed (x86-64 with AVX2, 2 cores, build of 3ca5084):

- scalar and avx2 do not agree bit for bit: no row of the 1667 has equal hashes, and the tiny q4_k
  model's MTP drafts after decoding differ. The kernels sum in different orders (f32 rows differ by ~1e-6), and
  the int8-activation paths differ by more (gemma3's logits by several units, both ISAs equally far from
  exact activations). Hence one set of hashes per ISA.
- Deterministic: two runs wrote byte-identical files; ``REGOLITH_THREADS=1``, the default (2) and 3 give
  identical hashes; regenerating the GGUFs gave byte-identical files.
- Chunk sizes do change bits (one token, 2-8 tokens and longer prefills run different kernels), so every
  case fixes its chunking, and the demo's drafted generation turns off the cost gate, which times the
  machine to choose draft lengths.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # for tests.*; regolith itself comes from the environment (the old build)

import regolith
from regolith import _core
from tests import engine_cases as ec

FORMAT = 1
# The tiny checkpoints: the tests' defaults (indexer_n_heads 8 keeps the QSA block choice free of ties) with
# 6 routed experts (top 4) instead of 16, which keeps the seven files near 4 MB; every layer kind stays.
TINY = {"indexer_n_heads": 8, "output_gate_type": "sigmoid", "num_experts": 6}


def regenerate_models(out: Path) -> None:
    """Write the tiny GGUFs of ``ec.TINY_FILES`` into ``out``."""
    import torch

    from regolith.convert import convert, convert_mmproj
    from tests.qwen4exp_models import save_tiny_model, save_tiny_mtp, tiny_mtp_weights, tiny_text_config
    from tests.qwen4exp_vision_models import save_tiny_vl_model

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        hf = save_tiny_model(tmp / "tiny-mtp", 7, **TINY)
        save_tiny_mtp(hf, tiny_mtp_weights(tiny_text_config(**TINY), seed=8))
        for outtype in ("f32", "q8_0", "q4_k"):
            convert(hf, out / f"tiny-mtp-{outtype}.gguf", outtype)
        hf = save_tiny_model(tmp / "tiny-nople", 9, **TINY, ple_layer_ids=[])
        convert(hf, out / "tiny-nople-q8_0.gguf", "q8_0")
        save_tiny_vl_model(tmp / "tiny-vl", 3, num_experts=TINY["num_experts"])
        convert(tmp / "tiny-vl", out / "tiny-vl-q8_0.gguf", "q8_0", mmproj=out / "tiny-vl-mmproj-f16.gguf")
        convert_mmproj(tmp / "tiny-vl", out / "tiny-vl-mmproj-f32.gguf", "f32")
    missing = [f for f in ec.TINY_FILES if not (out / f).is_file()]
    if missing:
        raise SystemExit(f"regeneration did not write {missing}")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _dumps(record: dict) -> str:
    """JSON with one line per array row, so that a diff shows which rows changed."""
    lines = ["{"]
    lines += [
        f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}," for k, v in record.items() if k != "isas"
    ]
    lines.append('  "isas": {')
    isas = list(record["isas"].items())
    for i, (isa, cases) in enumerate(isas):
        lines.append(f"    {json.dumps(isa)}: {{")
        for j, (case, parts) in enumerate(cases.items()):
            lines.append(f"      {json.dumps(case)}: {{")
            for k, (name, part) in enumerate(parts.items()):
                end = "," if k + 1 < len(parts) else ""
                if "rows" not in part:
                    lines.append(f"        {json.dumps(name)}: {json.dumps(part)}{end}")
                    continue
                rows = ",\n".join(f"          {json.dumps(r)}" for r in part["rows"])
                lines.append(f'        {json.dumps(name)}: {{"shape": {json.dumps(part["shape"])}, "rows": [')
                lines.append(rows)
                lines.append(f"        ]}}{end}")
            lines.append("      }" + ("," if j + 1 < len(cases) else ""))
        lines.append("    }" + ("," if i + 1 < len(isas) else ""))
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def record(isas: list[str], group: str | None = None, log=print) -> dict:
    """Run every case (of ``group`` only, if given) under each ISA; returns {isa: {case: digest}}."""
    out: dict[str, dict] = {}
    before = _core.isa()
    try:
        for isa in isas:
            _core.set_isa(isa)
            out[isa] = {}
            for case in ec.CASES.values():
                if group is not None and case.group != group:
                    continue
                reason = case.missing()
                if reason:
                    raise SystemExit(f"cannot record {case.name}: {reason}")
                start = time.perf_counter()
                with tempfile.TemporaryDirectory() as tmp:
                    out[isa][case.name] = ec.digest(case.run(Path(tmp)))
                log(f"{isa:7s} {case.name:55s} {time.perf_counter() - start:7.2f} s")
    finally:
        _core.set_isa(before)
    return out


def record_group(out: Path, group: str, isas: list[str]) -> None:
    """Replace the hashes of ``group``'s cases in ``out`` by this build's, and name this build in
    ``rerecorded[group]``: the other groups stay the pre-refactor build's."""
    result = json.loads(out.read_text())
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    for isa, cases in record(isas, group).items():
        result["isas"][isa].update(cases)
    result.setdefault("rerecorded", {})[group] = {
        "core_sha256": _sha256(Path(_core.__file__)),
        "repo_head": head,
    }
    tmp = out.with_suffix(".tmp")
    tmp.write_text(_dumps(result))
    os.replace(tmp, out)
    print(f"re-recorded the {group} cases of {out} for {', '.join(isas)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ec.LOGITS, help="where to write (default: %(default)s)")
    ap.add_argument("--isa", action="append", help="record only this ISA (repeatable; default: every one)")
    ap.add_argument("--regenerate-models", action="store_true", help="rebuild the tiny GGUFs first")
    ap.add_argument("--force", action="store_true", help="overwrite a logits.json of another _core build")
    ap.add_argument(
        "--group", choices=sorted({c.group for c in ec.CASES.values()}),
        help="re-record only this group's cases into --out, after a deliberate change of their numerics",
    )  # fmt: skip
    args = ap.parse_args()
    if args.group:
        return record_group(args.out, args.group, args.isa or _core.available_isas())

    core = Path(_core.__file__)
    core_sha = _sha256(core)
    print(f"regolith from {Path(regolith.__file__).parent}; _core sha256 {core_sha[:16]}")
    if args.out.is_file() and not args.force:
        old = json.loads(args.out.read_text()).get("core_sha256")
        if old != core_sha:
            raise SystemExit(
                f"{args.out} was recorded by another _core build ({str(old)[:16]}); the fixture must come "
                "from the pre-refactor build. Run with that build, or pass --force."
            )
    if args.regenerate_models or any(not (ec.FIXTURES / f).is_file() for f in ec.TINY_FILES):
        regenerate_models(ec.FIXTURES)

    isas = args.isa or _core.available_isas()
    unknown = sorted(set(isas) - set(_core.available_isas()))
    if unknown:
        raise SystemExit(f"ISA {unknown} not available here (available: {_core.available_isas()})")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout
    result = {
        "format": FORMAT,
        "core_sha256": core_sha,
        "repo_head": head.strip(),
        "numpy": __import__("numpy").__version__,
        "files": {f: _sha256(ec.FIXTURES / f) for f in ec.TINY_FILES},
        "isas": record(isas),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(_dumps(result))
    os.replace(tmp, args.out)
    rows = sum(len(p["rows"]) for c in result["isas"][isas[0]].values() for p in c.values() if "rows" in p)
    print(f"wrote {args.out}: {len(ec.CASES)} cases x {len(isas)} ISAs, {rows} rows per ISA")


if __name__ == "__main__":
    main()
