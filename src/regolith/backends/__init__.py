"""The compute engines this build has.

Every op of every model runs on a backend (``csrc/core/backend.h``): ``"cpu"`` is the reference;
``"cpu-opaque"`` runs the same kernels on memory the host cannot address outside backend calls, with ops
deferred until the core waits on them, which proves the engine never touches device memory from the host;
``"cuda"`` (a build made where nvcc was found, on a machine with an NVIDIA GPU) runs on the GPU;
``"metal"`` (Apple platforms with a Metal GPU) runs the kernels of ``metal/*.metal`` on the GPU, and
``"metal-emu"`` (every build) runs the same kernels and the same host code with the GPU emulated on the CPU
(slow: for verifying the Metal backend where there is no Mac). ``python -m regolith.backends.check`` compares
a backend with the CPU op by op.
"""

from __future__ import annotations

import os

from .. import _core

__all__ = ["DEFAULT", "available", "cache_types", "device_memory", "device_name", "resolve"]

DEFAULT = "cpu"


def available() -> list[str]:
    """The backends this build has, the reference ("cpu") first."""
    return list(_core.backend_names())


def resolve(name: str | None) -> str:
    """The backend a model loads on: ``name``, else ``$REGOLITH_BACKEND``, else ``"cpu"``; ``"auto"`` is the
    GPU where this build and machine have one ("cuda", else "metal"), else "cpu". Raises ValueError for a
    backend this build does not have."""
    chosen = name or os.environ.get("REGOLITH_BACKEND") or DEFAULT
    here = available()
    if chosen == "auto":
        return next((b for b in ("cuda", "metal") if b in here), "cpu")
    if chosen not in here:
        if chosen == "cuda":
            raise ValueError(
                "the cuda backend needs a build of regolith made where CUDA's nvcc was found and an NVIDIA GPU; "
                f"here there are {', '.join(here)}"
            )
        if chosen == "metal":
            raise ValueError(
                "the metal backend needs an Apple platform with a Metal GPU (metal-emu runs its kernels on the "
                f"CPU, slowly); here there are {', '.join(here)}"
            )
        raise ValueError(f"unknown backend {chosen!r}; this build has {', '.join(here)}")
    return chosen


def cache_types(name: str | None = None) -> list[str]:
    """The attention cache types (``Model.load(kv_type=...)``) the backend has kernels for: qwen4exp's QSA caches
    and the dense models' q8_0 / i8 ones (every backend has f16 / f32 dense caches)."""
    return list(_core.backend_cache_types(resolve(name)))


def device_memory(name: str) -> tuple[int, int] | None:
    """(free, total) bytes of backend ``name``'s own memory (a discrete GPU's VRAM); None where its memory is
    the host's RAM (the CPU backends), which memory plans count as RAM."""
    return _core.device_memory(resolve(name))


def device_name(name: str) -> str:
    """The device backend ``name`` runs on, for reports (a GPU's name, e.g. "NVIDIA H200", "Apple M4 Pro");
    empty for the host's CPU."""
    return _core.backend_device(resolve(name))
