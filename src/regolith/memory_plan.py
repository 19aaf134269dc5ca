"""The memory plan made at load: what stays resident, how large the expert arena is, and whether it all
fits in the budget (``memory_gb``), decided before anything large is allocated."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, replace

from .errors import MemoryPlanError
from .model_sizes import PREFILL_CHUNK, ModelSizes

__all__ = [
    "MemoryPlan",
    "human_bytes",
    "plan_memory",
    "process_rss",
    "render_contexts",
    "system_memory",
]

GIB = 1 << 30


def system_memory() -> int:
    """Bytes of physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# Library code a process first runs after loading a model (its first prefill and generation: the kernels,
# the sampler, the draft paths), beside what it held at load: 4.8 MiB of shared-library pages for the demo
# model and Qwen2.5-Coder alike, 3.7 MiB after a prefill alone for Gemma 3 (2,048 tokens, AVX-512 kernels).
CODE_AFTER_LOAD_BYTES = 5 << 20


def runtime_overhead() -> int:
    """The plan's runtime row: this process's resident set now (interpreter, libraries, the metadata and the
    tokenizer, measured before the weights load) and the library code its first evaluations add."""
    return process_rss() + CODE_AFTER_LOAD_BYTES


def process_rss() -> int:
    """This process's resident set size in bytes (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes of each part of a loaded model and the total against the budget."""

    sizes: ModelSizes
    n_ctx: int
    arena_slots: int  # 0: experts resident, mapped with the dense weights
    ple_cache_bytes: int
    overhead_bytes: int  # the process before the weights (interpreter, libraries, metadata, tokenizer)
    budget_bytes: int | None
    host_slots: int = 0  # records of the host-RAM tier behind a device arena (0: none)
    device: tuple[str, int] | None = None  # (backend, free bytes) where the backend has memory of its own
    windows: int = 1  # windows of n_ctx tokens each (a server's --parallel sequences)
    routes_on_device: bool = False  # Model.load's device_routing: the host tier holds every expert

    # The parts a backend with its own memory (a GPU) holds there; the rest is host RAM.
    DEVICE_PARTS = (
        "dense weights (resident)",
        "vision encoder",
        "MTP head",
        "expert arena",
        "experts (resident)",
        "KV / state",
        "scratch",
    )

    @property
    def streaming(self) -> bool:
        return self.arena_slots > 0

    @property
    def arena_bytes(self) -> int:
        return self.arena_slots * self.sizes.slot_bytes

    @property
    def host_tier_bytes(self) -> int:
        return self.host_slots * self.sizes.slot_bytes

    @property
    def scratch_bytes(self) -> int:
        """A step's scratch: one prefill chunk's activations and, routing on the device, a layer's records
        copied to device memory in one piece for a prefill chunk (SparseMoe::forward)."""
        staged = self.sizes.n_expert * self.sizes.slot_bytes if self.routes_on_device else 0
        attention = self.sizes.attention_per_token * self.n_ctx
        return self.sizes.scratch_bytes(self.streaming and not self.routes_on_device) + staged + attention

    @property
    def resident_expert_bytes(self) -> int:
        return self.arena_bytes if self.streaming else self.sizes.expert_bytes

    @property
    def state_bytes(self) -> int:
        return self.sizes.state_bytes(self.n_ctx) * self.windows

    def with_windows(self, n: int) -> MemoryPlan:
        """This plan holding ``n`` windows' state instead."""
        if n < 1:
            raise MemoryPlanError(f"a plan holds at least one window, not {n}")
        return replace(self, windows=n)

    def windows_that_fit(self, limit: int) -> int:
        """The most windows (1..``limit``) whose state fits beside the rest of the plan in its budget (three
        quarters of physical memory without one; a GPU's free memory for a plan on one)."""
        if self.device is not None:
            room, used = int(self.device[1] * 0.9), self.device_bytes
        else:
            room = self.budget_bytes if self.budget_bytes is not None else system_memory() * 3 // 4
            used = self.total_bytes
        per = max(self.sizes.state_bytes(self.n_ctx), 1)
        return max(1, min(limit, self.windows + (room - used) // per))

    @property
    def total_bytes(self) -> int:
        return (
            self.sizes.dense_bytes
            + self.sizes.mtp_bytes
            + self.resident_expert_bytes
            + self.state_bytes
            + self.scratch_bytes
            + self.host_tier_bytes
            + self.ple_cache_bytes
            + self.sizes.ple_index_bytes
            + self.sizes.vision_bytes
            + self.overhead_bytes
        )

    def rows(self) -> list[tuple[str, int, str]]:
        s = self.sizes
        rows = [("dense weights (resident)", s.dense_bytes, "")]
        if s.mtp_bytes:
            where = "through the arena" if self.streaming else "resident"
            rows.append(("MTP head (resident)", s.mtp_bytes, f"its {s.mtp_experts} experts {where}"))
        if s.n_experts_total:
            if self.streaming:
                share = self.arena_slots / s.n_experts_total
                rows.append(
                    (
                        "expert arena",
                        self.arena_bytes,
                        f"{self.arena_slots} of {s.n_experts_total} experts ({share:.1%}); {human_bytes(s.expert_bytes)} on disk",
                    )
                )
                if self.host_slots:
                    share = self.host_slots / s.n_experts_total
                    rows.append(
                        (
                            "expert host tier",
                            self.host_tier_bytes,
                            f"{self.host_slots} experts ({share:.1%}) in RAM behind the device arena",
                        )
                    )
            else:
                rows.append(("experts (resident)", s.expert_bytes, f"all {s.n_experts_total}"))
        windows = "one window" if self.windows == 1 else f"{self.windows} windows (--parallel)"
        rows.append((f"KV / state at {self.n_ctx} tokens", self.state_bytes, windows))
        staged = ", a layer's experts staged" if self.routes_on_device else ""
        keys = ", attention over every key" if s.attention_per_token else ""
        rows.append(("scratch", self.scratch_bytes, f"prefill chunk of {PREFILL_CHUNK} tokens{keys}{staged}"))
        if s.ple_rows:
            rows.append(
                (
                    "PLE row cache",
                    self.ple_cache_bytes,
                    f"table {human_bytes(s.ple_rows * s.ple_row_bytes)} on disk",
                )
            )
            if s.ple_index_bytes:
                rows.append(("PLE block checksums", s.ple_index_bytes, ""))
        if s.vision_bytes:
            rows.append(
                ("vision encoder", s.vision_bytes, "the projector's weights, loaded while images are encoded")
            )
        rows.append(("runtime (before load)", self.overhead_bytes, "interpreter, libraries, tokenizer"))
        return rows

    def on_device(self, name: str) -> bool:
        """Whether the row ``name`` of :meth:`rows` lives in the backend's own memory."""
        return self.device is not None and name.startswith(self.DEVICE_PARTS)

    @property
    def device_bytes(self) -> int:
        """Bytes in the backend's own memory (0 where its memory is host RAM)."""
        return sum(size for name, size, _ in self.rows() if self.on_device(name))

    @property
    def host_bytes(self) -> int:
        """Bytes in host RAM."""
        return self.total_bytes - self.device_bytes

    def render(self, width: int | None = None) -> str:
        """The plan as a text table (with a column saying where each part lives, for a GPU backend); with a
        width, notes that would pass it wrap onto lines of their own under the note column."""
        label = max(len(r[0]) for r in self.rows())
        budget = f"  of a {human_bytes(self.budget_bytes)} budget" if self.budget_bytes else ""
        rows = []
        for name, size, note in self.rows():
            where = ("VRAM  " if self.on_device(name) else "RAM   ") if self.device else ""
            rows.append((f"{name:<{label}}  {human_bytes(size):>10}  ", where + note))
        total = f"{'total':<{label}}  {human_bytes(self.total_bytes):>10}"
        if self.device:
            where = (
                f"VRAM {human_bytes(self.device_bytes)} of {human_bytes(self.device[1])} free on "
                f"{self.device[0]}, RAM {human_bytes(self.host_bytes)}{budget}"
            )
            rows.append((total + "  ", where))
        else:
            rows.append((total, budget))
        lines = []
        for head, note in rows:
            room = (width or 0) - len(head)
            if width is None or len(head) + len(note) <= width or room < 20:
                lines.append((head + note).rstrip())
            else:
                wrapped = textwrap.wrap(note.strip(), room)
                lines.append(head + wrapped[0])
                lines += [" " * len(head) + more for more in wrapped[1:]]
        return "\n".join(lines)


def render_contexts(plans: list[MemoryPlan]) -> str:
    """Plans of one model at several contexts side by side: a size column per plan (headed by its context),
    the notes of the first."""
    rows = [p.rows() for p in plans]
    names = [name.replace(f" at {plans[0].n_ctx} tokens", "") for name, _, _ in rows[0]]
    if any(len(r) != len(rows[0]) for r in rows):
        raise ValueError("the plans have different parts")
    label = max(len(n) for n in [*names, "total"])
    head = " " * label + "".join(f"  {f'{p.n_ctx:,} ctx':>12}" for p in plans)
    lines = [head]
    for i, name in enumerate(names):
        sizes = "".join(f"  {human_bytes(r[i][1]):>12}" for r in rows)
        lines.append(f"{name:<{label}}{sizes}  {rows[0][i][2]}".rstrip())
    budget = plans[0].budget_bytes
    totals = "".join(f"  {human_bytes(p.total_bytes):>12}" for p in plans)
    lines.append(f"{'total':<{label}}{totals}" + (f"  of a {human_bytes(budget)} budget" if budget else ""))
    return "\n".join(lines)


def human_bytes(n: int) -> str:
    """``n`` bytes as B / KiB / MiB / GiB with three significant figures (four from 1000 up to the next unit)."""
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.3g} {unit}" if v < 1000 else f"{v:.0f} {unit}"
    return f"{n} B"


def plan_memory(
    sizes: ModelSizes,
    *,
    n_ctx: int,
    memory_gb: float | None = None,
    arena_gb: float | None = None,
    ple_cache_gb: float | None = None,
    host_cache_gb: float | None = None,
    overhead_bytes: int = 0,
    physical_bytes: int | None = None,
    device: tuple[str, int] | None = None,
    windows: int = 1,
    device_routing: bool = False,
) -> MemoryPlan:
    """Decide the arena (with the state of ``windows`` windows of ``n_ctx`` tokens counted in): ``arena_gb`` when given; else, for a GGUF whose experts fit the budget (``memory_gb``,
    default three quarters of physical memory), every expert resident; else the budget left after everything
    else. ``host_cache_gb`` (with ``arena_gb``) adds a host-RAM tier of that many GiB of records behind a
    device arena. ``device`` = (backend, free bytes) for a backend with memory of its own (a GPU): the dense
    weights, the experts or their arena, the state and scratch go there and are sized against 90% of its
    free memory; the rest against the host budget. ``device_routing`` (a device arena whose host tier holds
    every expert, ``Model.load``'s) counts a layer's experts in the scratch. Raises MemoryPlanError when even
    one arena slot does not fit, when ``arena_gb`` exceeds the budget (or the device), or when
    ``device_routing`` lacks its arena or host tier."""
    if windows < 1:
        raise MemoryPlanError(f"a plan holds at least one window, not {windows}")
    if host_cache_gb is not None and host_cache_gb <= 0:
        raise MemoryPlanError(f"host_cache_gb must be positive, got {host_cache_gb}")
    if host_cache_gb is not None and arena_gb is None:
        raise MemoryPlanError("host_cache_gb needs arena_gb: the host tier sits behind a device arena")
    if memory_gb is not None and memory_gb <= 0:
        raise MemoryPlanError(f"memory_gb must be positive, got {memory_gb}")
    if arena_gb is not None and arena_gb <= 0:
        raise MemoryPlanError(f"arena_gb must be positive, got {arena_gb}")
    physical = physical_bytes or system_memory()
    budget = int(memory_gb * GIB) if memory_gb is not None else None
    cap = budget if budget is not None else physical * 3 // 4
    ple_cache = (
        int(ple_cache_gb * GIB)
        if ple_cache_gb is not None
        else (min(256 << 20, sizes.ple_rows * sizes.ple_head_dim * 4) if sizes.ple_rows else 0)
    )

    if device_routing and (arena_gb is None or host_cache_gb is None):
        raise MemoryPlanError(
            "device_routing needs an arena (arena_gb) and a host tier of every expert (host_cache_gb)"
        )

    def plan(slots: int, host_slots: int = 0) -> MemoryPlan:
        if device_routing and host_slots < sizes.n_experts_total:
            raise MemoryPlanError(
                f"device_routing needs a host tier of every expert: host_cache_gb={host_cache_gb} holds "
                f"{host_slots} of {sizes.n_experts_total} (all take {sizes.n_experts_total * sizes.slot_bytes / GIB:.3f})"
            )
        return MemoryPlan(
            sizes,
            n_ctx,
            slots,
            ple_cache,
            overhead_bytes,
            budget,
            host_slots,
            device,
            windows,
            device_routing,
        )

    if device is not None:
        return _plan_with_device(sizes, plan, device, arena_gb, host_cache_gb, budget, memory_gb)

    if not sizes.n_experts_total:
        p = plan(0)
        if budget is not None and p.total_bytes > budget:
            raise MemoryPlanError(
                f"the model needs {human_bytes(p.total_bytes)}, over memory_gb={memory_gb}:\n{p.render()}"
            )
        return p
    slot = sizes.slot_bytes
    if arena_gb is not None:
        slots, host_slots = _given_slots(sizes, arena_gb, host_cache_gb)
        p = plan(slots, host_slots)
        if budget is not None and p.total_bytes > budget:
            raise MemoryPlanError(f"arena_gb={arena_gb} does not fit memory_gb={memory_gb}:\n{p.render()}")
        return p
    if not sizes.packed and plan(0).total_bytes <= cap:
        return plan(0)
    fixed = plan(1).total_bytes - slot  # everything but the arena, streaming (its scratch may be larger)
    slots = min(sizes.n_experts_total, max(0, (cap - fixed) // slot))
    if slots < 1:
        need = fixed + slot
        raise MemoryPlanError(
            f"the model needs at least {human_bytes(need)} (dense weights, state, one expert slot); "
            f"the budget is {human_bytes(cap)}:\n{plan(1).render()}"
        )
    return plan(slots)


def _given_slots(sizes: ModelSizes, arena_gb: float, host_cache_gb: float | None) -> tuple[int, int]:
    """The arena slots of ``arena_gb`` and the host-tier slots of ``host_cache_gb`` (0 without it)."""
    slot = sizes.slot_bytes
    slots = min(sizes.n_experts_total, int(arena_gb * GIB) // slot)
    if slots < 1:
        raise MemoryPlanError(f"arena_gb={arena_gb} holds no expert: one slot is {human_bytes(slot)}")
    if host_cache_gb is None:
        return slots, 0
    host_slots = min(sizes.n_experts_total, int(host_cache_gb * GIB) // slot)
    if host_slots <= slots:
        raise MemoryPlanError(
            f"host_cache_gb={host_cache_gb} holds {host_slots} experts, no more than the arena's {slots}"
        )
    return slots, host_slots


def _plan_with_device(
    sizes: ModelSizes,
    plan: Callable[..., MemoryPlan],
    device: tuple[str, int],
    arena_gb: float | None,
    host_cache_gb: float | None,
    budget: int | None,
    memory_gb: float | None,
) -> MemoryPlan:
    """plan_memory for a backend with its own memory: its parts against 90% of the device's free bytes."""
    name, free = device
    cap = free * 9 // 10
    slot = sizes.slot_bytes

    def checked(p: MemoryPlan) -> MemoryPlan:
        if p.device_bytes > cap:
            raise MemoryPlanError(
                f"the model needs {human_bytes(p.device_bytes)} on {name}, over 90% of its "
                f"{human_bytes(free)} free:\n{p.render()}"
            )
        if budget is not None and p.host_bytes > budget:
            raise MemoryPlanError(
                f"the model needs {human_bytes(p.host_bytes)} of RAM, over memory_gb={memory_gb}:\n{p.render()}"
            )
        return p

    if not sizes.n_experts_total:
        return checked(plan(0))
    if arena_gb is not None:
        slots, host_slots = _given_slots(sizes, arena_gb, host_cache_gb)
        return checked(plan(slots, host_slots))
    if not sizes.packed and plan(0).device_bytes <= cap:
        return checked(plan(0))
    fixed = plan(1).device_bytes - slot  # everything but the arena, streaming (its scratch may be larger)
    slots = min(sizes.n_experts_total, max(0, (cap - fixed) // slot))
    if slots < 1:
        raise MemoryPlanError(
            f"the model needs at least {human_bytes(fixed + slot)} on {name} (dense weights, state, one expert "
            f"slot); 90% of its {human_bytes(free)} free is {human_bytes(cap)}:\n{plan(1).render()}"
        )
    return checked(plan(slots))
