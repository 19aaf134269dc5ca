"""Build the demo corpus and its tokenizer from text every machine has: no downloads.

Sources, in this order (each file one document, documents joined by ``<|endoftext|>``):

1. the running Python's standard library sources: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]``
   except ``site-packages``, sorted by relative path, read as UTF-8 (files that are not are skipped);
2. the licence texts in ``/usr/share/common-licenses`` (Debian), if present, symlinks resolved and deduplicated;
3. short ChatML conversations made from (1): for every public module-level function and class with a docstring,
   ``<|im_start|>user\\nWhat does `module.name` do?<|im_end|>\\n<|im_start|>assistant\\n{first docstring
   paragraph}<|im_end|>`` (so that ``regolith chat`` has seen its template).

A document is held out when the first byte of sha256(its source's relative path) is < 6 (about 2.3%); the
conversations follow their source file. Writes into OUT: ``tokenizer.json`` and ``tokenizer_config.json``
(a byte-level BPE trained with ``tokenizers`` on the training documents, Qwen3.5's pre-tokenizer, specials
``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` at ids 0-2, a ChatML chat template), ``train.bin`` and
``heldout.bin`` (uint16 token ids, documents separated by ``<|endoftext|>``), and ``manifest.json`` (every
file with its byte count and sha256, a hash of the whole list, token counts).

Usage: ``python -m tools.train_demo.corpus OUT [--vocab 8192]``
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
import sysconfig
from pathlib import Path

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen3.5's pre-tokenizer regex; regolith's converter maps it to llama.cpp's "qwen35".
PRE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LICENCES = Path("/usr/share/common-licenses")


def held_out(name: str) -> bool:
    """The deterministic split: a document is held out when sha256(name)'s first byte is < 6."""
    return hashlib.sha256(name.encode()).digest()[0] < 6


def source_files() -> list[tuple[str, Path]]:
    """(name, path) of every source file, in corpus order; names are stable across machines."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [
        (f"stdlib/{p.relative_to(stdlib).as_posix()}", p)
        for p in sorted(stdlib.rglob("*.py"))
        if "site-packages" not in p.relative_to(stdlib).parts and p.is_file()
    ]
    if LICENCES.is_dir():
        seen: set[Path] = set()
        for p in sorted(LICENCES.iterdir()):
            real = p.resolve()
            if real.is_file() and real not in seen:
                seen.add(real)
                files.append((f"licenses/{p.name}", real))
    return files


def conversations(name: str, text: str) -> list[str]:
    """ChatML question/answer documents from the public top-level docstrings of a Python source."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    module = name.removeprefix("stdlib/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    out = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if not doc:
            continue
        answer = doc.strip().split("\n\n")[0].strip()[:600]
        out.append(
            f"<|im_start|>user\nWhat does `{module}.{node.name}` do?<|im_end|>\n"
            f"<|im_start|>assistant\n{answer}<|im_end|>\n"
        )
    return out


def documents() -> tuple[list[str], list[str], list[dict]]:
    """(train documents, held-out documents, manifest entries)."""
    train, held, manifest = [], [], []
    chats: list[tuple[bool, str]] = []
    for name, path in source_files():
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if any(s in text for s in SPECIALS):
            continue
        ho = held_out(name)
        manifest.append(
            {"name": name, "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest(), "heldout": ho}
        )
        (held if ho else train).append(text)
        if name.startswith("stdlib/"):
            chats += [(ho, c) for c in conversations(name, text)]
    for ho, c in chats:
        (held if ho else train).append(c)
    return train, held, manifest


def train_tokenizer(docs: list[str], vocab: int):
    """A byte-level BPE (tokenizers' BpeTrainer) with the specials at ids 0-2."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=Regex(PRE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[AddedToken(s, special=True, normalized=False) for s in SPECIALS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    return tok


def encode(tok, docs: list[str]) -> np.ndarray:
    """uint16 ids of the documents, each followed by <|endoftext|> (id 0)."""
    parts = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        parts.append(np.asarray(enc.ids + [0], dtype=np.uint16))
    return np.concatenate(parts)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    train, held, manifest = documents()
    tok = train_tokenizer(train, args.vocab)
    tok.save(str(args.out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (args.out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    train_ids, held_ids = encode(tok, train), encode(tok, held)
    train_ids.tofile(args.out / "train.bin")
    held_ids.tofile(args.out / "heldout.bin")
    listing = "\n".join(f"{m['name']} {m['bytes']} {m['sha256']}" for m in manifest).encode()
    summary = {
        "python": sys.version.split()[0],
        "stdlib": sysconfig.get_paths()["stdlib"],
        "files": len(manifest),
        "file_list_sha256": hashlib.sha256(listing).hexdigest(),
        "bytes_train": sum(len(d.encode()) for d in train),
        "bytes_heldout": sum(len(d.encode()) for d in held),
        "documents_train": len(train),
        "documents_heldout": len(held),
        "tokens_train": int(train_ids.size),
        "tokens_heldout": int(held_ids.size),
        "vocab_size": tok.get_vocab_size(),
        "train_bin_sha256": hashlib.sha256(train_ids.tobytes()).hexdigest(),
        "heldout_bin_sha256": hashlib.sha256(held_ids.tobytes()).hexdigest(),
    }
    (args.out / "manifest.json").write_text(json.dumps({**summary, "entries": manifest}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
