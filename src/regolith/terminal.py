"""What the command line writes to a terminal and reads from it: streamed text, the speed and arena reports
(fitted to the terminal's width), the prefill progress bar, the chat's input reader and its command list."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from .generation import Generation
    from .model import Model

__all__ = [
    "CHAT_HELP",
    "PrefillBar",
    "human_bytes",
    "print_parts",
    "read_message",
    "report",
    "report_arena",
    "stream",
]


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


def print_parts(console: Console, parts: Sequence[str], sep: str) -> None:
    """parts joined by sep on one dim line where the console is wide enough, else packed into lines of at
    most its width (continuations indented), each part whole where it fits: no mid-word terminal wrap."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(sep) + len(part) <= console.width:
            lines[-1] += sep + part
        else:
            lines.append(("  " if lines else "") + part)
    console.print(f"[dim]{escape(chr(10).join(lines))}[/dim]", highlight=False, soft_wrap=True)


def report_arena(model: Model, console: Console) -> None:
    st = model.stats()
    if "hits" not in st:
        return
    parts = [
        f"experts: hit rate {st['hit_rate']:.1%} ({st['hits']} hits, {st['misses']} misses)",
        f"{human_bytes(st['bytes_read'])} read",
        f"{st['read_stall_s']:.2f} s waiting for reads",
        f"{st['prefetch_hits']} of {st['prefetches']} prefetches used",
    ]
    print_parts(console, parts, ", ")


class PrefillBar:
    """A progress bar on stderr while a long prompt (more than two prefill chunks) is evaluated: the
    ``on_prefill`` callback of a generation."""

    def __init__(self, console: Console):
        self.console = console
        self.progress: Any = None

    def __call__(self, done: int, total: int) -> None:
        from .generation import PREFILL_CHUNK

        if total <= 2 * PREFILL_CHUNK:
            return
        if self.progress is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(
                TextColumn("prefill"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self.progress.start()
            self.task = self.progress.add_task("prefill", total=total)
        self.progress.update(self.task, completed=done)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def stream(gen: Generation, out: Any) -> None:
    for piece in gen:
        out.write(piece)
        out.flush()


def report(gen: Generation, console: Console) -> None:
    st = gen.stats
    parts = [
        f"prompt {st.prompt_tokens} tokens ({st.cached_tokens} cached), {st.prefill_tokens_per_second:.1f} tok/s",
        f"generated {st.generated_tokens} tokens, {st.decode_tokens_per_second:.1f} tok/s",
    ]
    if st.drafted_tokens:
        parts.append(
            f"drafted {st.drafted_tokens}, accepted {st.accepted_tokens}, {st.tokens_per_round:.2f} tokens/round"
        )
    parts.append(str(gen.finish_reason))
    print_parts(console, parts, " | ")


CHAT_HELP = """commands: /reset (forget the conversation), /save PATH (write it as JSON), /help, /exit (or Ctrl-D)
multi-line input: end a line with \\ to continue it, or wrap a block in triple quotes (\"\"\")"""


def read_message(console: Console) -> str | None:
    """One user message from the terminal (None at end of input)."""
    try:
        line = input(">>> ")
    except EOFError:
        return None
    if line.strip() == '"""':
        lines = []
        while True:
            try:
                more = input("... ")
            except EOFError:
                break
            if more.strip() == '"""':
                break
            lines.append(more)
        return "\n".join(lines)
    lines = []
    while line.endswith("\\"):
        lines.append(line[:-1])
        try:
            line = input("... ")
        except EOFError:
            break
    lines.append(line)
    return "\n".join(lines)
