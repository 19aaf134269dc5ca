"""``tokenizer.ggml.*`` metadata for a byte-level BPE (gpt2-style) tokenizer, as llama.cpp's converter
writes it (``_set_vocab_gpt2`` + gguf-py's ``SpecialVocab``), read from ``tokenizer.json`` and
``tokenizer_config.json`` without transformers.

Simplifications, each an error or a documented no-op rather than a silent difference: the pre-tokenizer is
recognised by its regex (llama.cpp hashes a tokenization of a fixed text instead; an unknown regex is an
error unless a name is given), TemplateProcessing post-processors are not read (no add_bos/eot inference
from them), and added tokens that are not normalized are taken as written (llama.cpp round-trips them
through the tokenizer, which leaves byte-level BPE specials unchanged).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gguf import GGUFValueType, Keys, TokenType

from ..errors import ModelFormatError

__all__ = ["PRE_TOKENIZERS", "gpt2_tokenizer_metadata"]

Metadata = list[tuple[str, Any, GGUFValueType]]

# tokenizer.json Split regex -> llama.cpp's tokenizer.ggml.pre name (src/llama-vocab.cpp)
PRE_TOKENIZERS: dict[str, str] = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen35",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
    # o200k (gpt-oss, GPT-4o)
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "gpt-4o",
}
_SPECIAL_KEYS = {
    "bos": Keys.Tokenizer.BOS_ID,
    "eos": Keys.Tokenizer.EOS_ID,
    "unk": Keys.Tokenizer.UNK_ID,
    "sep": Keys.Tokenizer.SEP_ID,
    "pad": Keys.Tokenizer.PAD_ID,
    "mask": Keys.Tokenizer.MASK_ID,
}


def _looks_special(tok: str) -> bool:
    return (
        tok in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (tok.startswith("<|") and tok.endswith("|>"))
        or (tok.startswith("<｜") and tok.endswith("｜>"))
        or (tok.startswith("<unused") and tok.endswith(">"))
    )


def _pre_name(tokenizer: dict[str, Any]) -> str:
    pre = tokenizer.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    for part in parts:
        if part.get("type") == "Split":
            regex = (part.get("pattern") or {}).get("Regex")
            if regex in PRE_TOKENIZERS:
                return PRE_TOKENIZERS[regex]
            raise ModelFormatError(
                f"tokenizer.json: unknown pre-tokenizer regex {regex!r}; pass the llama.cpp pre-tokenizer "
                f"name (e.g. --tokenizer-pre qwen35)"
            )
    if len(parts) == 1 and parts[0].get("type") == "ByteLevel" and parts[0].get("use_regex", True):
        return "gpt-2"
    raise ModelFormatError("tokenizer.json: unrecognised pre-tokenizer; pass --tokenizer-pre NAME")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFormatError(f"{path}: not valid JSON ({e})") from None


def gpt2_tokenizer_metadata(
    hf_dir: str | Path, vocab_size: int, *, pre: str | None = None
) -> Metadata | None:
    """The tokenizer keys for ``hf_dir`` (None when it has no tokenizer.json). ``vocab_size`` is the
    model's (rows of the embedding); ids the tokenizer lacks become ``[PAD{i}]`` UNUSED tokens."""
    hf_dir = Path(hf_dir)
    tok_file = hf_dir / "tokenizer.json"
    if not tok_file.is_file():
        return None
    tokenizer = _read_json(tok_file)
    model = tokenizer.get("model") or {}
    if model.get("type") != "BPE":
        raise ModelFormatError(f"tokenizer.json: model type {model.get('type')!r}; only BPE is supported")
    tc_file = hf_dir / "tokenizer_config.json"
    tconfig: dict[str, Any] = _read_json(tc_file) if tc_file.is_file() else {}
    added = {int(a["id"]): a for a in tokenizer.get("added_tokens", [])}
    reverse = {int(i): t for t, i in model.get("vocab", {}).items()}
    reverse.update({i: a["content"] for i, a in added.items()})
    if reverse and max(reverse) >= vocab_size:
        raise ModelFormatError(f"tokenizer has id {max(reverse)} but the model's vocab_size is {vocab_size}")

    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(int(TokenType.UNUSED))
        elif i in added:
            tok = reverse[i]
            if added[i].get("special") or _looks_special(tok):
                types.append(int(TokenType.CONTROL))
            else:
                tok = tok.replace("\u2581", " ")
                types.append(int(TokenType.USER_DEFINED))
            tokens.append(tok)
        else:
            tokens.append(reverse[i])
            types.append(int(TokenType.NORMAL))

    merges = model.get("merges") or []
    if merges and not isinstance(merges[0], str):
        merges = [
            " ".join("".join(chr(ord(c) + 256) if c == " " else c for c in p) for p in m) for m in merges
        ]

    md: Metadata = [
        (Keys.Tokenizer.MODEL, "gpt2", GGUFValueType.STRING),
        (Keys.Tokenizer.PRE, pre or _pre_name(tokenizer), GGUFValueType.STRING),
        (Keys.Tokenizer.LIST, tokens, GGUFValueType.STRING),
        (Keys.Tokenizer.TOKEN_TYPE, types, GGUFValueType.INT32),
    ]
    if merges:
        md.append((Keys.Tokenizer.MERGES, list(merges), GGUFValueType.STRING))

    # special ids (no cls: gguf has no key for it): tokenizer_config.json's tokens (by added-token content), then config.json's *_token_id
    special: dict[str, int] = {}
    by_content = {a["content"]: i for i, a in added.items()}
    for typ in _SPECIAL_KEYS:
        entry = tconfig.get(f"{typ}_token")
        content = entry.get("content") if isinstance(entry, dict) else entry
        if isinstance(content, str) and content in by_content:
            special.setdefault(typ, by_content[content])
    config_file = hf_dir / "config.json"
    config = _read_json(config_file) if config_file.is_file() else {}
    for typ in _SPECIAL_KEYS:
        tid = config.get(f"{typ}_token_id")
        if tid is None and isinstance(config.get("text_config"), dict):
            tid = config["text_config"].get(f"{typ}_token_id")
        if isinstance(tid, int) and not isinstance(tid, bool) and tid >= 0:
            special.setdefault(typ, tid)
    md += [(_SPECIAL_KEYS[typ], tid, GGUFValueType.UINT32) for typ, tid in special.items()]

    add: dict[str, bool] = {}
    post = tokenizer.get("post_processor") or {}
    for proc in post.get("processors", [post]) if post else []:
        if proc.get("type") == "ByteLevel":
            add.setdefault("bos", False)
            add.setdefault("eos", False)
        elif proc.get("type") == "RobertaProcessing":
            add.update(bos=True, eos=True, sep=True)
    for typ in _SPECIAL_KEYS:
        if isinstance(tconfig.get(f"add_{typ}_token"), bool):
            add.setdefault(typ, tconfig[f"add_{typ}_token"])
    add_keys = {"bos": Keys.Tokenizer.ADD_BOS, "eos": Keys.Tokenizer.ADD_EOS, "sep": Keys.Tokenizer.ADD_SEP}
    md += [(add_keys[t], v, GGUFValueType.BOOL) for t, v in add.items() if t in add_keys]

    template = tconfig.get("chat_template") if tconfig else None
    if template is None and tconfig:
        if (hf_dir / "chat_template.jinja").is_file():
            template = (hf_dir / "chat_template.jinja").read_text(encoding="utf-8")
        elif (hf_dir / "chat_template.json").is_file():
            template = _read_json(hf_dir / "chat_template.json").get("chat_template")
    if isinstance(template, str):
        md.append((Keys.Tokenizer.CHAT_TEMPLATE, template, GGUFValueType.STRING))
    return md
