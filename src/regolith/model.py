"""Loading a model and generating with it: :class:`Model` (weights, tokenizer, chat template), whose inference
contexts are :class:`regolith.Window` (:mod:`regolith.window`)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import platform
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import _core
from . import backends as _backends
from . import gguf as _gguf
from . import memory_plan as _plan
from . import model_sizes as _sizes
from . import pack as _pack
from . import state as _state
from .antislop import SlopList, SlopMatcher
from .chat import ChatTemplate, Message, fallback_template
from .errors import ImageError, MemoryPlanError, ModelFormatError, RegolithError
from .generation import Generation, SharedPrompt, TokenGuide
from .memory_plan import MemoryPlan
from .models import ModelFiles, cache_root, resolve_files
from .prompt_cache import PromptCache, chat_boundaries
from .sampling import SamplingParams
from .speculative import CostGate, Speculation, speculation
from .tokenizer import Tokenizer
from .vision import IMAGE_PAD, ImageSpan, VisionTower, render_with_images, split_images
from .window import Window

__all__ = ["Model"]

DEFAULT_CTX = 8192
DEFAULT_MAX_TOKENS = 256
# llama.cpp's defaults, which users of its tools know.
SAMPLING_DEFAULTS: dict[str, Any] = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05}
# Speculation cost files kept under cache_root()/speculation (Model.remember_speculation), newest first.
REMEMBERED = 64


def plan_sizes(
    files: ModelFiles,
    tensors: dict[str, Any],
    metadata: dict[str, Any],
    manifest: dict[str, Any] | None,
    kv_type: str,
) -> _sizes.ModelSizes:
    """The sizes the memory plan takes for ``files``: the model's parts from its tensors and metadata (and a
    packed model's manifest), with the vision encoder's weights when a projector is among the files."""
    sizes = _sizes.sizes_from_gguf(tensors, metadata, manifest, kv_type)
    if files.mmproj is None:
        return sizes
    with _gguf.open(files.mmproj) as v:
        vision = _sizes.vision_bytes(v.tensors, v.metadata, os.fspath(files.mmproj))
    return dataclasses.replace(sizes, vision_bytes=vision)


def default_n_ctx(context_length: int | None) -> int:
    """The context a model's windows get by default: its trained context length, at most DEFAULT_CTX."""
    return min(int(context_length or DEFAULT_CTX), DEFAULT_CTX)


_log = logging.getLogger("regolith")
_warned_unlocked = False


def _host_cpu() -> str:
    """The host CPU's model name (Linux's /proc/cpuinfo), else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _keep_newest(folder: Path, n: int, *, spare: Path) -> None:
    """Delete all but the ``n`` most recently modified ``*.json`` files of ``folder`` (``spare`` aside)."""
    try:
        files = [p for p in folder.glob("*.json") if p != spare]
        files.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return
    for old in files[n:]:
        with contextlib.suppress(OSError):
            old.unlink()


def _warn_unlocked(reason: str) -> None:
    global _warned_unlocked
    if not _warned_unlocked:
        _warned_unlocked = True
        warnings.warn(
            f"the expert arena could not be locked in RAM ({reason}); it may be swapped out. "
            "Raise RLIMIT_MEMLOCK (ulimit -l) to lock it.",
            RuntimeWarning,
            stacklevel=3,
        )


KV_TYPES = ("f32", "f16", "q8_0", "i8")


def tokenizer_at_load(metadata: Mapping[str, Any]) -> Tokenizer | None:
    """The tokenizer of a GGUF's metadata, built before the memory plan measures the process (it is most of
    what a large vocabulary costs: ``Model.load``, ``regolith inspect --plan``); None where the file has none
    or a malformed one (:attr:`Model.tokenizer` raises then, as it would have)."""
    if "tokenizer.ggml.model" not in metadata:
        return None
    try:
        return Tokenizer.from_gguf(metadata)
    except ModelFormatError:
        return None


def _check_kv_type(core: Any, kv_type: str) -> None:
    try:
        core.check_kv_type(kv_type)
    except RegolithError as e:
        raise ValueError(f"kv_type {kv_type!r}: {e}") from None


_ARCHITECTURES = {
    "gemma3": _core.DenseModel,
    "qwen2": _core.DenseModel,
    "qwen3": _core.DenseModel,
    "qwen3moe": _core.DenseModel,
    "gpt-oss": _core.DenseModel,
    "qwen4exp": _core.Qwen4ExpModel,
    "qwen35moe": _core.Qwen4ExpModel,
    "qwen3next": _core.Qwen4ExpModel,
}


class Model:
    """A model's weights (memory-mapped from a GGUF file), its tokenizer and chat template. Use :meth:`load`.

    :meth:`generate` and :meth:`chat` run on one window the model keeps, reusing the longest prefix of the
    previous prompt; starting a new generation there ends an unfinished streamed one. For independent
    conversations use :class:`regolith.Session` or :meth:`window`.
    """

    def __init__(
        self,
        core: Any,
        path: str,
        metadata: dict[str, Any],
        n_ctx: int | None = None,
        chat_template: str | None = None,
        plan: MemoryPlan | None = None,
        fingerprint: bytes | None = None,
        vision: VisionTower | None = None,
        files: ModelFiles | None = None,
        kv_type: str | None = None,
    ):
        self._core = core
        self.path = path
        self.files = files or ModelFiles(Path(path))
        """The model's files (:class:`regolith.models.ModelFiles`): the GGUF or its first shard (or the packed
        directory) and the side files loaded with it."""
        self.config: dict[str, Any] = core.config()
        self._metadata = metadata
        self.n_ctx = int(n_ctx or default_n_ctx(self.config.get("context_length")))
        self.plan = plan
        """The :class:`regolith.memory_plan.MemoryPlan` made at load (dense, arena, state, totals)."""
        self.kv_type = kv_type or _sizes.default_kv_type(self.config["architecture"])
        """The type of the windows' attention caches (:meth:`load`'s ``kv_type``)."""
        self._tokens_evaluated = 0
        self._tokenizer: Tokenizer | None = None
        self._template: ChatTemplate | None = None
        self._template_source = chat_template
        self._lock = threading.Lock()
        self._window: Window | None = None
        self._active: Generation | None = None
        self._fingerprint: bytes | None = fingerprint
        self.prompt_cache: PromptCache | None = None
        """A :class:`regolith.PromptCache` that generation restores prompt prefixes from and stores them in."""
        self.speculative: bool | str | Speculation = True
        """The default of :meth:`start`'s ``speculative`` (the command line's ``--spec`` / ``--draft-max``)."""
        self.scr = False
        """The default of :meth:`start`'s ``scr``: suffix cache reuse (``regolith serve --scr``)."""
        streams = hasattr(core, "arena_info") and core.arena_info() is not None
        self.spec_gate = CostGate(core.expert_stall_seconds if streams else None)
        """The speculative-decoding cost model every generation on this model uses and teaches."""
        self.vision = vision
        """The :class:`regolith.vision.VisionTower` of the projector given to :meth:`load`, or None."""

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int | None = None,
        chat_template: str | None = None,
        memory_gb: float | None = None,
        arena_gb: float | None = None,
        ple_cache_gb: float | None = None,
        host_cache_gb: float | None = None,
        device_routing: bool = False,
        moce: bool | Mapping[str, float] = False,
        lookahead: bool = True,
        io_threads: int = 4,
        lock_memory: bool = True,
        ple: str | os.PathLike[str] | None = None,
        mtp: str | os.PathLike[str] | None = None,
        mmproj: str | os.PathLike[str] | None = None,
        vision_idle_unload: float | None = 300.0,
        backend: str | None = None,
        kv_type: str | None = None,
        windows: int = 1,
    ) -> Model:
        """Load a GGUF file (any shard of a split model: every shard is read), a model directory, a packed model
        directory (``regolith pack``), a Hugging Face Hub repository (``"hf://ORG/REPO[:QUANT]"``, downloaded
        into the Hub's cache) or a known model name (default: the default model).

        ``ple`` and ``mtp`` are side files holding the PLE n-gram table and the MTP head apart from the model
        (GGUFs of the same architecture, whole or split); in a model directory they, and the projector, are
        found by name (``ple-*.gguf``, ``mtp-*.gguf``, ``mmproj-*.gguf``). The fingerprint saved states carry
        covers every file.

        ``n_ctx`` is the context of the windows :meth:`generate`, :meth:`chat` and sessions use (default: the
        model's context length, at most 8192). ``chat_template`` (jinja2 source) replaces the file's chat
        template. ``mmproj`` is a projector GGUF (llama.cpp's layout, ``regolith convert --mmproj``) that lets
        :meth:`chat` take images; its weights load on the first image and unload after
        ``vision_idle_unload`` seconds without one (None: kept).

        Mixture-of-experts models (qwen4exp, qwen35moe, qwen3next, qwen3moe, gpt-oss) get a memory plan (:attr:`plan`, logged at load): with ``arena_gb``
        the routed experts stream from disk through an arena of that size; without it, a GGUF whose experts
        fit ``memory_gb`` (default: three quarters of physical memory) keeps them all resident and otherwise
        the arena takes what the budget leaves. A packed directory always streams. Where the arena is device
        memory (``backend="cuda"``, ``"cpu-opaque"``), ``host_cache_gb`` (with ``arena_gb``) keeps that many
        GiB of expert records in host RAM behind it, so a miss it holds is a copy, not a disk read; on the CPU
        the arena is host RAM already and the option is refused. ``device_routing`` (with a tier holding every
        routed expert, on a GPU: ``backend="cuda"``; ``"cpu-opaque"`` imitates one) reads them all into it at
        load as memory the GPU reads in place: each layer's experts then run with no host round trip, from the
        arena where it holds them and over the bus otherwise, and the arena takes the experts used most
        between tokens (a ``MemoryPlanError`` where the plan has no such tier). ``ple_cache_gb`` sizes the
        PLE row cache; ``moce`` turns on cache-aware routing (True, or ``{"bonus": 2.0, "protect": 2}``;
        changes the output, off by default); ``lookahead`` prefetches each layer's predicted experts;
        ``io_threads`` read experts; ``lock_memory`` mlocks the arena (a warning once where the OS refuses).

        ``kv_type`` is the type of the windows' attention caches (llama.cpp's ``-ctk`` / ``-ctv`` names):
        ``"f32"``, ``"f16"``, ``"q8_0"`` (llama.cpp's blocks of 32) or ``"i8"`` (int8 rows with one f32 scale
        each, the seed's) for qwen4exp's QSA keys, values, indexer keys and pooled block keys (default
        ``"i8"``, the seed's: ``"f32"`` computes exactly what transformers does) and for the dense models' keys
        and values (default ``"f16"``, llama.cpp's). A type the
        backend has no kernels for is refused here with a ``ValueError``, as is a type the model cannot take
        (q8_0 needs head dims that are multiples of 32).

        ``backend`` names the compute engine (:func:`regolith.backends.available` lists this build's; ``"auto"``:
        the GPU where there is one, else the CPU; default: ``$REGOLITH_BACKEND`` or ``"cpu"``).

        ``windows`` is how many windows of ``n_ctx`` tokens the memory plan counts (a server's parallel
        sequences): an arena sized to the budget leaves room for their state.

        Raises :class:`regolith.GGUFError` for a malformed file, :class:`regolith.ModelFormatError` for an
        architecture regolith does not run, missing / mis-shaped tensors, a missing or foreign shard, a corrupt
        pack, :class:`regolith.HubError` for a failed download, and
        :class:`regolith.MemoryPlanError` when the plan cannot fit (before anything large is allocated).
        """
        if n_ctx is not None and n_ctx <= 0:
            raise ValueError(f"n_ctx must be positive, got {n_ctx}")
        if kv_type is not None and kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {', '.join(KV_TYPES)}, not {kv_type!r}")
        backend = _backends.resolve(backend)
        if host_cache_gb is not None and backend == "cpu":
            raise MemoryPlanError("host_cache_gb: on the cpu backend the expert arena is host RAM already")
        files = resolve_files(path, ple=ple, mtp=mtp, mmproj=mmproj)
        resolved = str(files.model)
        packed = _pack.open_packed(resolved) if _pack.is_packed(resolved) else None
        gguf_path = str(packed.dense) if packed else resolved
        with _gguf.open(gguf_path, side_files=files.side_files) as f:
            arch = f.architecture
            metadata = f.metadata
            tensors = f.tensors
            groups = f.groups
        if arch not in _ARCHITECTURES:
            supported = ", ".join(sorted(_ARCHITECTURES))
            raise ModelFormatError(f"architecture {arch!r} is not supported (supported: {supported})")
        tokenizer = tokenizer_at_load(metadata)
        # what the process holds before the weights: interpreter, libraries, the metadata and the tokenizer
        # (Gemma 3's 262k-token vocabulary: 170 MiB)
        overhead = _plan.runtime_overhead()
        kv_type = kv_type or _sizes.default_kv_type(arch)
        sizes = plan_sizes(files, tensors, metadata, packed.manifest if packed else None, kv_type)
        ctx = int(n_ctx or default_n_ctx(metadata.get(f"{arch}.context_length")))
        plan = _plan.plan_memory(
            sizes,
            n_ctx=ctx,
            memory_gb=memory_gb,
            arena_gb=arena_gb,
            ple_cache_gb=ple_cache_gb,
            host_cache_gb=host_cache_gb,
            overhead_bytes=overhead,
            device=(backend, dev[0]) if (dev := _backends.device_memory(backend)) else None,
            windows=windows,
            device_routing=device_routing,
        )
        _log.info("memory plan for %s:\n%s", resolved, plan.render())
        if not sizes.n_expert:
            core = _ARCHITECTURES[arch](groups, backend=backend)
            _check_kv_type(core, kv_type)
        else:
            moce_opts = dict(moce) if isinstance(moce, Mapping) else {}
            experts = {
                "experts_path": str(packed.experts) if packed else "",
                "arena_slots": plan.arena_slots,
                "io_threads": io_threads,
                "lock": lock_memory,
                "lookahead": lookahead,
                "moce": bool(moce),
                "moce_bonus": float(moce_opts.get("bonus", 2.0)),
                "moce_protect": int(moce_opts.get("protect", 2)),
                "backend": backend,
                "host_slots": plan.host_slots,
                "device_routing": device_routing,
            }
            if arch == "qwen4exp":
                ple = str(packed.ple) if packed and packed.ple else ""
                core = _core.Qwen4ExpModel(
                    groups, ple_path=ple, ple_cache_bytes=plan.ple_cache_bytes, **experts
                )
            else:
                core = _ARCHITECTURES[arch](groups, **experts)
            _check_kv_type(core, kv_type)
            info = core.arena_info()
            if info is not None and lock_memory and not info["locked"]:
                _warn_unlocked(info["lock_error"])
        vision = None
        if files.mmproj is not None:
            if arch not in ("qwen4exp", "qwen35moe"):
                raise ModelFormatError(f"images need a qwen4exp or qwen35moe model, not {arch!r}")
            vision = VisionTower(os.fspath(files.mmproj), idle_unload=vision_idle_unload, backend=backend)
        model = cls(
            core,
            resolved,
            metadata,
            ctx,
            chat_template,
            plan=plan,
            fingerprint=packed.fingerprint if packed else None,
            vision=vision,
            files=files,
            kv_type=kv_type,
        )
        model._tokenizer = tokenizer
        if vision is not None and vision.out_dim != model.config["hidden_size"]:
            raise ModelFormatError(
                f"the projector makes {vision.out_dim}-wide embeddings; the model's hidden size is "
                f"{model.config['hidden_size']}"
            )
        return model

    def stats(self) -> dict[str, Any]:
        """Counters since load (or :meth:`reset_stats`): for a model streaming its experts ``hits``,
        ``misses``, ``hit_rate``, ``per_layer_hit_rate``, ``bytes_read``, ``reads``, ``read_stall_s``,
        ``prefetches``, ``prefetch_hits`` and ``host_hits`` (device slots the host tier filled without a read,
        for misses and prefetches: :meth:`load`'s ``host_cache_gb``); for PLE models ``ple_rows_read`` (from disk),
        ``ple_cache_hits`` and ``ple_rows_read_per_token``; ``tokens`` evaluated."""
        out: dict[str, Any] = {"tokens": self._tokens_evaluated}
        if not hasattr(self._core, "stats"):
            return out
        raw = self._core.stats()
        out.update(raw)
        if "hits" in raw:
            used = raw["hits"] + raw["misses"]
            out["hit_rate"] = raw["hits"] / used if used else 0.0
            out["per_layer_hit_rate"] = [
                h / (h + m) if h + m else 0.0
                for h, m in zip(raw.pop("layer_hits"), raw.pop("layer_misses"), strict=True)
            ]
            del out["layer_hits"], out["layer_misses"]
        if self._tokens_evaluated and "ple_rows_read" in raw:
            out["ple_rows_read_per_token"] = raw["ple_rows_read"] / self._tokens_evaluated
        return out

    def reset_stats(self) -> None:
        """Zero the counters :meth:`stats` reports."""
        self._tokens_evaluated = 0
        if hasattr(self._core, "reset_stats"):
            self._core.reset_stats()

    @property
    def fingerprint(self) -> bytes:
        """32 bytes identifying the model's files (:func:`regolith.state.model_fingerprint`: its shards, side files
        and projector); saved states carry it."""
        if self._fingerprint is None:
            f = self.files
            self._fingerprint = _state.model_fingerprint(
                f.model, side_files=[*f.side_files, *([f.mmproj] if f.mmproj else [])]
            )
        return self._fingerprint

    def remember_speculation(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Keep :attr:`spec_gate`, the speculation cost model, in a file across processes: take back what an
        earlier process on this model and machine learned (its costs and acceptance counts), and save it
        again when generations end (at most every ``regolith.speculative.SAVE_SECONDS``), so that a new
        process drafts as well as the last one ended instead of exploring again (the command line does
        this unless ``--no-spec-memory``). ``path`` defaults to a file per setting the costs depend on
        (model, backend, device, threads, arena and cache sizes) in the ``speculation`` folder of
        :func:`regolith.models.cache_root`, where the :data:`REMEMBERED` most recently used are kept. A file that cannot be read costs exploration, never output. Returns the path."""
        plan = self.plan
        setting = {
            "model": self.fingerprint.hex(),
            "backend": self._core.backend,
            "device": _backends.device_name(self._core.backend) or _host_cpu(),
            "threads": _core.threads(),
            "arena_slots": plan.arena_slots if plan is not None else 0,
            "host_slots": plan.host_slots if plan is not None else 0,
            "kv_type": self.kv_type,
        }
        if path is None:
            folder = cache_root() / "speculation"
            digest = hashlib.sha256(json.dumps(setting, sort_keys=True).encode()).hexdigest()[:32]
            path = folder / f"{digest}.json"
            _keep_newest(folder, REMEMBERED - 1, spare=path)
        self.spec_gate.remember(path, setting)
        return Path(path)

    def window(self, max_ctx: int | None = None) -> Window:
        """A new inference context holding up to ``max_ctx`` tokens (default: :attr:`n_ctx`)."""
        if max_ctx is None:
            max_ctx = self.n_ctx
        if max_ctx <= 0:
            raise ValueError("max_ctx must be positive")
        return Window(self, self._core.new_window(int(max_ctx), self.kv_type), on_eval=self._count_evaluated)

    def _count_evaluated(self, n: int) -> None:
        self._tokens_evaluated += n

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer, built from its GGUF metadata at load (so the memory plan counts it); a
        malformed one raises :class:`regolith.ModelFormatError` here."""
        if self._tokenizer is None:
            self._tokenizer = Tokenizer.from_gguf(self._metadata)
        return self._tokenizer

    @property
    def chat_template(self) -> ChatTemplate:
        """The model's chat template (the one given to :meth:`load`, else ``tokenizer.chat_template``, else a
        fallback chosen from its special tokens)."""
        if self._template is None:
            tok = self.tokenizer
            special = {
                "bos_token": tok.id_to_token(tok.bos_id) if tok.bos_id is not None else "",
                "eos_token": tok.id_to_token(tok.eos_id) if tok.eos_id is not None else "",
            }
            source = self._metadata.get("tokenizer.chat_template")
            if self._template_source is not None:
                self._template = ChatTemplate(self._template_source, special=special, name="given")
            elif isinstance(source, str) and source.strip():
                self._template = ChatTemplate(source, special=special)
            else:
                name, source = fallback_template(lambda t: tok.token_to_id(t) is not None)
                self._template = ChatTemplate(source, special=special, name=f"fallback {name}")
        return self._template

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds BOS/EOS as the model asks, ``parse_special`` reads
        special-token text such as ``<|im_start|>`` as the special token."""
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """The text of token ``ids``."""
        return self.tokenizer.decode(ids, skip_special=skip_special)

    def chat_prompt(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        reasoning_effort: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """The prompt tokens of a conversation, rendered with :attr:`chat_template`."""
        text = self.chat_template.render(
            messages,
            tools=tools,
            reasoning_effort=reasoning_effort,
            add_generation_prompt=add_generation_prompt,
        )
        return self.tokenize_chat(text)

    def tokenize_chat(self, text: str) -> list[int]:
        """Token ids of a rendered chat: special-token text parsed, BOS added once."""
        ids = self.tokenize(text)
        bos = self.tokenizer.bos_id
        if len(ids) >= 2 and ids[0] == ids[1] == bos:
            del ids[0]  # the template wrote BOS and the tokenizer added one
        return ids

    def image_prompt(self, text: str, images: Sequence[Any]) -> tuple[list[int], list[ImageSpan]]:
        """Token ids of a rendered chat whose ``<|image_pad|>`` placeholders stand for ``images`` (paths,
        bytes, data URLs or PIL images, in order), each expanded to its image's tokens, and the image spans
        for :meth:`start`. Raises :class:`regolith.ImageError` for an unusable image, a placeholder count
        that differs from the images', or a model without vision support."""
        if self.vision is None:
            raise ImageError(
                "model has no vision support (load it with a projector: Model.load(..., mmproj=...))"
            )
        pad = self.tokenizer.token_to_id(IMAGE_PAD)
        if pad is None:
            raise ModelFormatError(f"the model's vocabulary has no {IMAGE_PAD} token for images")
        ids = self.tokenize_chat(text)
        at = [i for i, t in enumerate(ids) if t == pad]
        if len(at) != len(images):
            raise ImageError(f"the prompt has {len(at)} image placeholders for {len(images)} images")
        merge = self.vision.processor.merge_size
        out: list[int] = []
        spans: list[ImageSpan] = []
        prev = 0
        for i, source in zip(at, images, strict=True):
            out += ids[prev:i]
            span = ImageSpan(len(out), self.vision.encode(source), merge)
            spans.append(span)
            out += [pad] * span.n_tokens
            prev = i + 1
        out += ids[prev:]
        return out, spans

    def multimodal_prompt(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        reasoning_effort: str | None = None,
        add_generation_prompt: bool = True,
    ) -> tuple[list[int], list[ImageSpan]]:
        """The prompt tokens of a conversation with images in its content parts (see :meth:`chat`) and
        the image spans to pass to :meth:`start` (``images=``)."""
        plain, sources = split_images(messages)
        text = render_with_images(
            self.chat_template,
            plain,
            len(sources),
            tools=tools,
            reasoning_effort=reasoning_effort,
            add_generation_prompt=add_generation_prompt,
        )
        return self.image_prompt(text, sources)

    def start(
        self,
        prompt: Sequence[int],
        *,
        window: Window | None = None,
        images: Sequence[ImageSpan] = (),
        max_tokens: int = DEFAULT_MAX_TOKENS,
        stop: str | Sequence[str] | None = None,
        antislop: bool | SlopList | Sequence[str] = False,
        on_finish: Callable[[Generation], None] | None = None,
        guide: TokenGuide | None = None,
        boundaries: Sequence[int] = (),
        speculative: bool | str | Speculation | None = None,
        on_prefill: Callable[[int, int], None] | None = None,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        shared: SharedPrompt | None = None,
        scr: bool | None = None,
        gate: CostGate | None = None,
        **sampling: Any,
    ) -> Generation:
        """A :class:`Generation` continuing token ids ``prompt`` on ``window`` (default: the model's window).

        With a :attr:`prompt_cache`, the prompt's longest cached prefix is restored before prefilling, and the
        state is stored at ``boundaries`` (token offsets into ``prompt``, such as
        :func:`regolith.prompt_cache.chat_boundaries` gives), at the end of the prompt and after the reply.

        ``sampling`` are :class:`regolith.SamplingParams` fields (temperature, top_p, top_k, min_p,
        repeat_penalty, presence_penalty, frequency_penalty, logit_bias, seed). ``antislop``: True for the
        shipped phrase list, or a list of phrases / a :class:`regolith.antislop.SlopList`. ``guide`` may force
        and refuse tokens (:class:`regolith.generation.TokenGuide`). ``images`` are the prompt's image spans
        (:meth:`multimodal_prompt`); such prompts bypass the prompt cache. ``speculative`` (default
        :attr:`speculative`): True drafts from the prompt and reply and the model's MTP head behind the cost
        gate, which drafts only when it measures a gain; False or ``"off"`` decodes plainly; ``"suffix"`` /
        ``"mtp"`` one drafter; or a :class:`regolith.speculative.Speculation`. The output is the same either
        way. ``on_prefill(done, total)`` is called as the prompt is evaluated, after each chunk of
        :data:`regolith.generation.PREFILL_CHUNK` tokens (``total``: the tokens the prompt needs evaluated).
        ``logprobs`` / ``prompt_logprobs`` record the log-probabilities of the generated / prompt tokens with
        that many most likely alternatives, and ``shared`` shares one evaluation of the prompt between
        generations of it (:class:`regolith.generation.Generation`). ``scr`` (default :attr:`scr`): suffix
        cache reuse on attention-only models, the window's tokens after an edit in the prompt moved instead of
        evaluated again (not exact: :func:`regolith.generation.prefill`). ``gate``: the speculation cost model
        to draft by and teach (default :attr:`spec_gate`, the model's).
        """
        params = SamplingParams(**{**SAMPLING_DEFAULTS, **sampling})
        spec = speculation(self.speculative if speculative is None else speculative)
        stops = [stop] if isinstance(stop, str) else list(stop or ())

        def make(target: Window) -> Generation:
            target.attach_images(images)
            return Generation(
                target,
                self.tokenizer,
                prompt,
                max_tokens=max_tokens,
                sampling=params,
                stop=stops,
                slop=_slop_matcher(antislop),
                on_finish=on_finish,
                guide=guide,
                cache=None if images else self.prompt_cache,
                boundaries=boundaries,
                speculation=spec,
                gate=self.spec_gate if gate is None else gate,
                on_prefill=on_prefill,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                shared=shared,
                scr=self.scr if scr is None else scr,
            )

        if window is not None:
            return make(window)
        with self._lock:
            if self._active is not None:
                self._active.close()
            if self._window is None:
                self._window = self.window()
            self._active = make(self._window)
            return self._active

    def generate(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = DEFAULT_MAX_TOKENS,
        *,
        temperature: float = SAMPLING_DEFAULTS["temperature"],
        top_p: float = SAMPLING_DEFAULTS["top_p"],
        top_k: int = SAMPLING_DEFAULTS["top_k"],
        min_p: float = SAMPLING_DEFAULTS["min_p"],
        stop: str | Sequence[str] | None = None,
        seed: int | None = None,
        stream: bool = False,
        antislop: bool | SlopList | Sequence[str] = False,
        speculative: bool | str | Speculation | None = None,
        on_prefill: Callable[[int, int], None] | None = None,
        **sampling: Any,
    ) -> str | Generation:
        """Continue ``prompt`` (text, tokenized with BOS as the model asks, or token ids).

        Returns the generated text, or with ``stream=True`` a :class:`Generation` yielding text pieces as they
        are decided. ``temperature=0`` is greedy; ``seed`` makes sampling reproducible; ``stop`` strings end the
        text before them; more :class:`regolith.SamplingParams` fields (repeat_penalty, presence_penalty,
        frequency_penalty, logit_bias) may be given as keywords. ``speculative`` and ``on_prefill`` are as for
        :meth:`start` (speculative decoding never changes the output).
        """
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        gen = self.start(
            ids,
            max_tokens=max_tokens,
            stop=stop,
            antislop=antislop,
            speculative=speculative,
            on_prefill=on_prefill,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            seed=seed,
            **sampling,
        )
        return gen if stream else "".join(gen)

    def chat(
        self,
        messages: Sequence[Message],
        max_tokens: int = DEFAULT_MAX_TOKENS,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        reasoning_effort: str | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> str | Generation:
        """Reply to a conversation (``[{'role': 'user', 'content': ...}, ...]``) through the chat template.

        ``content`` is a string or a list of parts: ``{"type": "text", "text": ...}``, images as
        ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` or
        ``{"type": "image", "image": <path, bytes or PIL image>}`` (needs a model loaded with ``mmproj``).
        Takes the keywords of :meth:`generate`; returns the reply text, or a :class:`Generation` when
        ``stream=True``. Raises :class:`regolith.ImageError` for an unusable image.
        """
        if split_images(messages)[1]:
            ids, images = self.multimodal_prompt(messages, tools=tools, reasoning_effort=reasoning_effort)
            gen = self.start(ids, images=images, max_tokens=max_tokens, **kwargs)
            return gen if stream else "".join(gen)
        ids = self.chat_prompt(messages, tools=tools, reasoning_effort=reasoning_effort)
        if self.prompt_cache is not None:
            kwargs["boundaries"] = chat_boundaries(
                self, messages, ids, tools=tools, reasoning_effort=reasoning_effort
            )
        gen = self.start(ids, max_tokens=max_tokens, **kwargs)
        return gen if stream else "".join(gen)


def _slop_matcher(antislop: bool | SlopList | Sequence[str] | None) -> SlopMatcher | None:
    if antislop is False or antislop is None:
        return None
    if antislop is True:
        return SlopMatcher(SlopList.default())
    return SlopMatcher(antislop)
