"""A model's byte counts, read from its GGUF's tensor infos and metadata (and a pack manifest): the dense
weights, the routed experts' records, the PLE table, the window state per token and fixed, the scratch of a
prefill chunk. The memory plan (memory_plan.py) adds them up against a budget."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import ModelFormatError

__all__ = [
    "HYBRID_ARCHITECTURES",
    "ModelSizes",
    "cache_row_bytes",
    "check_kv_type",
    "default_kv_type",
    "sizes_from_gguf",
    "vision_bytes",
]


DIRECT_ALIGN = 4096
PREFILL_CHUNK = 512  # tokens per evaluation in a prefill (generation.py)
# The final hidden states a window's draft head holds (MtpContext::kBufferRows, csrc/model/qwen4exp_mtp.h):
# up to kHeldRows (1,024) it has taken in or not (past that it takes them in, or keeps the latest), kCompactRows
# (256) not yet let go of and a prefill chunk's.
MTP_BUFFER_ROWS = 1024 + 256 + PREFILL_CHUNK
# routed experts' weights, what streams (gpt-oss' ffn_*_exps.bias stay resident with the dense tensors)
_EXPERT = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")
_PLE_TABLE = "per_layer_token_embd.weight"


def _align(n: int, a: int = DIRECT_ALIGN) -> int:
    return (n + a - 1) // a * a


SCRATCH_MIN_CHUNK = 1 << 20  # a window's workspace takes at least this much (csrc/core/buffers.cpp kMinChunk)


@dataclass(frozen=True)
class ModelSizes:
    """Byte counts of a model's parts, read from its GGUF (and pack manifest)."""

    architecture: str
    dense_bytes: int  # all but routed experts' weights, the PLE table and the MTP head: resident (mapped)
    expert_record_bytes: list[int] = field(default_factory=list)  # per MoE layer: one expert's gate+up+down
    n_expert: int = 0
    n_used: int = 0
    packed: bool = False
    ple_rows: int = 0
    ple_row_bytes: int = 0
    ple_head_dim: int = 0
    ple_index_bytes: int = 0  # a packed table's block checksums, held in memory
    state_per_token: int = 0  # window state growing with the context (attention KV, indexer keys)
    state_fixed: int = 0  # window state of fixed size (recurrent, conv, PLE history)
    hidden: int = 0
    hc: int = 1
    vocab: int = 0
    ff_expert: int = 0
    mtp_bytes: int = 0  # the MTP head's tensors but its routed experts (which count as a layer's experts)
    mtp_experts: int = 0  # the MTP head's routed experts (0: no head)
    dense_scratch: int = 0  # the dense engine's (gemma3, qwen2, qwen3(moe), gpt-oss): scratch_bytes
    streamed_scratch: int = 0  # qwen3moe, gpt-oss: what batching streamed experts on the host adds to it
    vision_bytes: int = 0  # the projector's weights (mmproj): the vision encoder, loaded for images
    # per context token, what evaluating at the end of the context holds beside the workspace and the state:
    # attending over every key, and one state buffer twice while it moves into a larger one
    # (_dense_attention_per_token; the hybrids' in _sizes)
    attention_per_token: int = 0
    # the CPU backend's PLE convolution of a prefill chunk: its rows after the state's history, f32, beside the
    # workspace (csrc/cpu/ple.cpp)
    ple_conv_bytes: int = 0

    @property
    def expert_bytes(self) -> int:
        return sum(self.expert_record_bytes) * self.n_expert

    @property
    def n_experts_total(self) -> int:
        return len(self.expert_record_bytes) * self.n_expert

    @property
    def slot_bytes(self) -> int:
        """An arena slot: the largest record with its alignment padding (as the C++ arena sizes it)."""
        if not self.expert_record_bytes:
            return 0
        if self.packed:
            return max(_align(r + DIRECT_ALIGN) for r in self.expert_record_bytes)
        return max(sum(_align(p + DIRECT_ALIGN) for p in parts) for parts in self._parts)

    _parts: list[tuple[int, int, int]] = field(default_factory=list, repr=False)

    def state_bytes(self, n_ctx: int) -> int:
        return self.state_fixed + self.state_per_token * n_ctx

    @property
    def expert_batch_bytes(self) -> int:
        """What the backend's products of resident experts (``Backend::moe_experts``) hold beside the workspace
        for a prefill chunk: the routed rows' input, gate, up and output and the shared expert's output, f32
        (the CPU backend's thread-local buffers, csrc/cpu/moe.cpp). Streamed experts batch them in the
        workspace instead (``scratch_bytes(streamed=True)``)."""
        if not self.n_expert:
            return 0
        return 4 * PREFILL_CHUNK * (self.n_used * (2 * self.hidden + 2 * self.ff_expert) + self.hidden)

    def scratch_bytes(self, streamed: bool = False) -> int:
        """Activations of one prefill chunk (estimate: streams, mixer and MoE buffers, one logits row; the
        dense models': what their workspace can hold for it, ``_dense_scratch``) and, for a mixture of
        experts, the routed rows: the backend's batch of resident experts (:attr:`expert_batch_bytes`), or
        with ``streamed`` experts (batched on the host in the workspace) what they add to it."""
        if self.architecture not in HYBRID_ARCHITECTURES:
            routed = self.streamed_scratch if streamed else self.expert_batch_bytes
            return self.dense_scratch + routed
        t = PREFILL_CHUNK
        streams = 6 * t * self.hc * self.hidden
        moe = t * max(self.n_used, 1) * (2 * self.hidden + 2 * self.ff_expert)
        estimate = max(4 * (streams + moe + 2 * self.vocab), SCRATCH_MIN_CHUNK)
        # streamed: the routed rows batched in the workspace (their input, gate, up and output, f32), which the
        # workspace's doubling chunks may hold twice over, and a first chunk (docs/streaming.md: Flash-Next)
        routed = 2 * 4 * moe + SCRATCH_MIN_CHUNK if streamed else self.expert_batch_bytes
        return estimate + routed + self.ple_conv_bytes


# The Qwen hybrid family (Gated DeltaNet and attention layers, routed experts with a shared one) that
# csrc/model/qwen4exp.h runs: qwen4exp (with hyper-connections, QSA and PLE), Qwen3.5 MoE and Qwen3-Next.
HYBRID_ARCHITECTURES = ("qwen4exp", "qwen35moe", "qwen3next")


def default_kv_type(architecture: str) -> str:
    """The attention cache type ``Model.load`` gives a model of ``architecture`` without ``kv_type``: the seed's
    int8 rows for qwen4exp's QSA caches (a quarter of f32's bytes; its fidelity cost is measured in
    docs/benchmarks.md), llama.cpp's f16 for the others (the dense models, Qwen3.5 MoE's KV caches)."""
    return "i8" if architecture == "qwen4exp" else "f16"


def cache_row_bytes(kv_type: str, n: int) -> int:
    """Bytes of one attention-cache row of n elements of a cache type (``Model.load``'s ``kv_type``): f32, f16,
    q8_0 (34 bytes per 32 elements) or i8 (n bytes and an f32 scale)."""
    if kv_type == "f32":
        return 4 * n
    if kv_type == "f16":
        return 2 * n
    if kv_type == "q8_0":
        if n % 32:
            raise ValueError(f"q8_0 cache rows are whole blocks of 32 elements, not {n}")
        return n // 32 * 34
    if kv_type == "i8":
        return n + 4
    raise ValueError(f"kv_type must be one of f32, f16, q8_0, i8, not {kv_type!r}")


def _dense_head_dim(metadata: dict[str, Any], arch: str) -> int:
    p = f"{arch}."
    if p + "attention.key_length" in metadata:
        return int(metadata[p + "attention.key_length"])
    return int(metadata[p + "embedding_length"]) // int(metadata[p + "attention.head_count"])


def _dense_attention_per_token(
    metadata: dict[str, Any], arch: str, kv_heads: list[int], row: int, kv_type: str
) -> int:
    """Bytes per context token a dense model's prefill holds outside its workspace while it attends over n_ctx
    keys: the CPU backend's scores of a block of 32 queries of a key head's group against every key
    (csrc/cpu/attention.cpp), with an 8-bit cache those keys and values dequantized to f32, and a layer's
    keys and values twice while its cache moves into a larger buffer (KvCache's geometric growth). 48 MiB at
    Gemma 3's 32k context: its peak RSS was that much over the plan before they were counted."""
    p = f"{arch}."
    group = int(metadata[p + "attention.head_count"]) // min(kv_heads)
    dequantized = 2 * 4 * _dense_head_dim(metadata, arch) if kv_type in ("q8_0", "i8") else 0
    return 4 * 32 * group + dequantized + 2 * max(kv_heads) * row


def _dense_scratch(
    metadata: dict[str, Any], arch: str, kv_heads: int, vocab: int, streamed: bool = False
) -> int:
    """What a gemma3 / qwen2 / qwen3(moe) / gpt-oss window's workspace can hold while it evaluates a prefill
    chunk (DenseWindow's forward, csrc/model/dense_lm.cpp): per token the residual stream, its norm and the
    attention output [hidden] x 3, queries and attention [heads * head_dim] x 2, keys and values [kv_heads *
    head_dim] x 2, the MLP's gate and up [ff] x 2 (or the mixture of experts' buffers) and two rope tables, all
    f32, and the last token's logits row. The workspace grows by chunks of twice the last one (the first at
    least SCRATCH_MIN_CHUNK), each left when the next tensor does not fit, so it can hold about twice the
    tensors, the largest one's room left unused (the MLP's) and its first chunk's minimum
    (tests/model/test_kv_cache_types.py and test_moe_streaming.py check the bound). Resident experts run on the
    backend from the routing on (Backend::moe_experts), their rows batched by the backend, not in the
    workspace; ``streamed``: batched in the workspace by the host."""
    p = f"{arch}."
    hidden, d = int(metadata[p + "embedding_length"]), _dense_head_dim(metadata, arch)
    n_head = int(metadata[p + "attention.head_count"])
    n_rot = int(metadata.get(p + "rope.dimension_count", d))
    t = PREFILL_CHUNK
    if p + "expert_count" in metadata:
        # qwen3moe's and gpt-oss' layers instead of the MLP (SparseMoe::forward): router logits [n_expert],
        # weights and ids [k]; streamed, per routed row (k per token) its token and pair ids, its input, gate,
        # up and output (gpt-oss' expert biases are resident tensors, added in place)
        ne, k = int(metadata[p + "expert_count"]), int(metadata[p + "expert_used_count"])
        fe = int(metadata[p + "expert_feed_forward_length"])
        ffn = 4 * (ne + 2 * k) + (k * (8 + 4 * (2 * hidden + 2 * fe)) if streamed else 0)
        largest = 4 * (k * max(hidden, fe) if streamed else max(hidden, n_head * d, ne))
    else:
        ff = int(metadata[p + "feed_forward_length"])
        ffn, largest = 4 * 2 * ff, 4 * ff
    per_token = 4 * (3 * hidden + 2 * n_head * d + 2 * kv_heads * d + 2 * n_rot) + ffn + 3 * 8 + 4
    return 2 * (t * per_token + t * largest + 4 * vocab) + SCRATCH_MIN_CHUNK


def vision_bytes(tensors: dict[str, Any], metadata: dict[str, Any], where: str) -> int:
    """The memory a projector GGUF's vision encoder (``tensors`` and ``metadata`` of the file at ``where``)
    takes when it is loaded: its matrices as stored, the other tensors (vectors, the patch kernel, the
    position embeddings) as f32, as csrc/model/vision.cpp loads them, and its rotary tables (head_dim / 2
    frequencies and axes, 4 bytes each). Raises ModelFormatError for a file that is not a projector."""
    try:
        head_dim = int(metadata["clip.vision.embedding_length"]) // int(
            metadata["clip.vision.attention.head_count"]
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise ModelFormatError(f"{where}: not a vision projector ({e!r})") from None
    return 4 * head_dim + sum(
        t.nbytes if len(t.shape) == 2 and "position_embd" not in name else 4 * math.prod(t.shape)
        for name, t in tensors.items()
    )


def check_kv_type(metadata: dict[str, Any], kv_type: str) -> None:
    """Raise ValueError unless the model's attention caches can be of ``kv_type`` (q8_0: rows of whole
    blocks of 32)."""
    cache_row_bytes(kv_type, 32)  # a known type
    arch = metadata.get("general.architecture")
    if kv_type == "q8_0" and arch:
        keys = (
            ("attention.key_length", "attention.indexer.key_length") if arch in HYBRID_ARCHITECTURES else ()
        )
        for key in keys:
            n = metadata.get(f"{arch}.{key}")
            if n is not None and int(n) % 32:
                raise ValueError(
                    f"kv_type 'q8_0': a q8_0 cache needs rows of whole blocks of 32; {key} is {n}"
                )
        if arch not in HYBRID_ARCHITECTURES and f"{arch}.embedding_length" in metadata:
            n = _dense_head_dim(metadata, arch)
            if n % 32:
                raise ValueError(
                    f"kv_type 'q8_0': a q8_0 cache needs rows of whole blocks of 32; head dim is {n}"
                )


def sizes_from_gguf(
    tensors: dict[str, Any],
    metadata: dict[str, Any],
    manifest: dict[str, Any] | None,
    kv_type: str = "f32",
) -> ModelSizes:
    """ModelSizes from a GGUF's tensor infos and metadata (and a pack manifest, whose dense GGUF lacks the
    experts and the PLE table), the attention caches of ``kv_type``. Raises ModelFormatError for a missing key
    or tensor; ValueError for a cache type the model cannot take (:func:`check_kv_type`)."""
    check_kv_type(metadata, kv_type)
    try:
        return _sizes(tensors, metadata, manifest, kv_type)
    except KeyError as e:
        raise ModelFormatError(f"missing metadata key or tensor {e}") from None
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise ModelFormatError(f"inconsistent model metadata: {e}") from None


def _expert_records(
    tensors: dict[str, Any], manifest: dict[str, Any] | None, n_layer: int, n_expert: int
) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Per layer: one expert's record bytes, and (GGUF in place) its gate, up and down parts' bytes."""
    if manifest is not None:
        return [int(r) for r in manifest["experts"]["record_bytes"]], []
    parts = [
        tuple(tensors[f"blk.{layer}.ffn_{k}_exps.weight"].nbytes // n_expert for k in ("gate", "up", "down"))
        for layer in range(n_layer)
    ]
    return [sum(x) for x in parts], parts  # type: ignore[misc]


def _sizes(
    tensors: dict[str, Any], metadata: dict[str, Any], manifest: dict[str, Any] | None, kv_type: str
) -> ModelSizes:
    arch = metadata.get("general.architecture", "")
    dense = sum(t.nbytes for n, t in tensors.items() if not _EXPERT.match(n) and n != _PLE_TABLE)
    if arch not in HYBRID_ARCHITECTURES:
        # gemma3, qwen2, qwen3(moe), gpt-oss (csrc/model/dense_lm.cpp): every layer keeps every position's
        # keys and values, the sliding-window layers' too
        p = f"{arch}."
        kvh = metadata[p + "attention.head_count_kv"]
        n_layer = int(metadata[p + "block_count"])
        heads = [int(h) for h in kvh] if isinstance(kvh, list) else [int(kvh)] * n_layer
        row = cache_row_bytes(kv_type, _dense_head_dim(metadata, arch))
        vocab = tensors["token_embd.weight"].shape[0]
        sizes = ModelSizes(
            arch,
            dense,
            state_per_token=sum(2 * h * row for h in heads),
            dense_scratch=_dense_scratch(metadata, arch, max(heads), vocab),
            attention_per_token=_dense_attention_per_token(metadata, arch, heads, row, kv_type),
        )
        if p + "expert_count" not in metadata:
            return sizes
        streamed = _dense_scratch(metadata, arch, max(heads), vocab, streamed=True)
        n_expert = int(metadata[p + "expert_count"])
        records, parts = _expert_records(tensors, manifest, n_layer, n_expert)
        return replace(
            sizes,
            expert_record_bytes=records,
            n_expert=n_expert,
            n_used=int(metadata[p + "expert_used_count"]),
            packed=manifest is not None,
            hidden=int(metadata[p + "embedding_length"]),
            vocab=vocab,
            ff_expert=int(metadata[p + "expert_feed_forward_length"]),
            streamed_scratch=streamed - sizes.dense_scratch,
            _parts=parts,
        )
    p = f"{arch}."
    hyper = arch == "qwen4exp"  # hyper-connections, QSA and PLE
    n_layer = int(metadata[p + "block_count"])
    if not 0 < n_layer <= len(tensors):  # every layer has tensors: a larger count is a lie
        raise ModelFormatError(f"{p}block_count {n_layer} exceeds the file's {len(tensors)} tensors")
    nextn = int(metadata.get(p + "nextn_predict_layers", 0))
    mtp_bytes = 0
    if nextn:
        head = f"blk.{n_layer - nextn}."
        if head + "nextn.eh_proj.weight" in tensors:
            mtp_bytes = sum(
                t.nbytes for n, t in tensors.items() if n.startswith(head) and not _EXPERT.match(n)
            )
            dense -= mtp_bytes
        elif manifest is None:
            n_layer -= nextn  # the MTP head is in a side file the model was opened without: no head
    hidden = int(metadata[p + "embedding_length"])
    n_expert = int(metadata[p + "expert_count"])
    records, parts = _expert_records(tensors, manifest, n_layer, n_expert)
    if manifest is not None:
        ple = manifest.get("ple")
        ple_rows, ple_row_bytes, ple_hd = (
            (int(ple["rows"]), int(ple["row_bytes"]), int(ple["head_dim"])) if ple else (0, 0, 0)
        )
        ple_index = 4 * int(ple["blocks"]) if ple else 0
    else:
        t = tensors.get(_PLE_TABLE)
        ple_rows, ple_row_bytes, ple_hd = (t.shape[0], t.row_bytes, t.shape[1]) if t else (0, 0, 0)
        ple_index = 0

    # Window state (csrc/model: QsaState or KvCache, GdnState, PleState), in bytes.
    recurrent = metadata.get(p + "attention.recurrent_layers")
    if recurrent is None:
        # the interval covers the main layers; an MTP block after them is an attention layer
        interval, n_main = (
            int(metadata.get(p + "full_attention_interval", 4)),
            int(metadata[p + "block_count"]) - nextn,
        )
        recurrent = [i < n_main and (i + 1) % interval != 0 for i in range(n_layer)]
    per_token = fixed = attention = 0
    layer_bytes = []  # per attention layer, its state's bytes per token
    n_qsa = sum(1 for r in recurrent if not r)
    if n_qsa:
        kvh, hd = int(metadata[p + "attention.head_count_kv"]), int(metadata[p + "attention.key_length"])
        idx = int(metadata[p + "attention.indexer.key_length"]) if hyper else 0
        ratios = [int(r) for r in metadata.get(p + "attention.compress_ratios", [])]
        for layer, rec in enumerate(recurrent):
            if not rec and not hyper:  # keys and values
                layer_bytes.append(2 * kvh * cache_row_bytes(kv_type, hd))
            elif not rec:
                ratio = ratios[layer] if layer < len(ratios) and ratios[layer] > 0 else 1
                # keys, values, raw indexer keys, 3-D (M-RoPE) positions; pooled indexer keys per complete block
                key, index_key = cache_row_bytes(kv_type, hd), cache_row_bytes(kv_type, idx)
                layer_bytes.append(2 * kvh * key + index_key + 3 * 8 + (index_key + ratio - 1) // ratio)
        per_token = sum(layer_bytes)
        if not hyper:  # full attention over every key (qwen4exp's QSA attends over its selected blocks)
            group = int(metadata[p + "attention.head_count"]) // kvh
            attention = 4 * 32 * group + (2 * 4 * hd if kv_type in ("q8_0", "i8") else 0)
    if mtp_bytes:
        # MtpContext's held final hidden states (f32) for the head: at most MTP_BUFFER_ROWS rows
        fixed += 4 * hidden * MTP_BUFFER_ROWS
    n_gdn = n_layer - n_qsa
    if n_gdn:
        k = int(metadata[p + "ssm.conv_kernel"])
        dk, nk = int(metadata[p + "ssm.state_size"]), int(metadata[p + "ssm.group_count"])
        nv, inner = int(metadata[p + "ssm.time_step_rank"]), int(metadata[p + "ssm.inner_size"])
        conv_dim = 2 * nk * dk + inner
        fixed += n_gdn * 4 * ((k - 1) * conv_dim + nv * dk * (inner // nv))
    hc = int(metadata[p + "hyper_connection.count"]) if hyper else 1
    ple_conv = 0
    for _ in metadata.get(p + "ple.layers", []):
        n, kernel = int(metadata[p + "ple.ngram_size"]), int(metadata[p + "ple.conv_kernel"])
        fixed += 8 * (n - 1) + 4 * (kernel - 1) * n * hc * hidden
        ple_conv = 4 * (PREFILL_CHUNK + kernel - 1) * hc * hidden
    vocab = tensors["token_embd.weight"].shape[0]
    return ModelSizes(
        architecture=arch,
        dense_bytes=dense,
        expert_record_bytes=records,
        n_expert=n_expert,
        n_used=int(metadata[p + "expert_used_count"]),
        packed=manifest is not None,
        ple_rows=ple_rows,
        ple_row_bytes=ple_row_bytes,
        ple_head_dim=ple_hd,
        ple_index_bytes=ple_index,
        state_per_token=per_token,
        state_fixed=fixed,
        hidden=hidden,
        hc=hc,
        vocab=vocab,
        ff_expert=int(metadata[p + "expert_feed_forward_length"]),
        mtp_bytes=mtp_bytes,
        mtp_experts=n_expert if mtp_bytes else 0,
        # a buffer growing by doubling holds its old rows beside the new for a moment, one at a time
        attention_per_token=attention + max(layer_bytes, default=0),
        ple_conv_bytes=ple_conv,
        _parts=parts,
    )
