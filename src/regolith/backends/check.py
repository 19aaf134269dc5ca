"""The backend conformance suite: ``python -m regolith.backends.check [--backend NAME] [--op OP]``.

Every op of the backend interface over many shapes and quant types (``csrc/core/backend_check.cpp``), run on
the backend and on the CPU reference from the same seeded inputs; each output compared by normalized mean
squared error against the tolerance stated for the op in that file (integer outputs must match exactly).
Exits 1 when any case fails.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from typing import Any

from .. import _core
from . import available

__all__ = ["check", "main"]


def check(backend: str, op: str = "", seed: int = 1) -> list[dict[str, Any]]:
    """Run the cases whose op name contains ``op`` on ``backend`` and on the CPU: one dict per case with
    ``op``, ``case``, ``nmse``, ``tolerance``, ``passed``, ``error`` and ``skipped`` (why a case of an attention
    cache type the backend refuses did not run; it then counts as passed)."""
    if backend not in available():
        raise ValueError(f"unknown backend {backend!r}; this build has {', '.join(available())}")
    return list(_core.check_backend(backend, op, seed))


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    parser = argparse.ArgumentParser(
        prog="python -m regolith.backends.check", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--backend", action="append", help="a backend to check (repeatable; default: every one)"
    )
    parser.add_argument("--op", default="", help="only the ops whose name contains this")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("-v", "--verbose", action="store_true", help="one row per case, not per op")
    args = parser.parse_args(argv)
    names = args.backend or [b for b in available() if b != "cpu"]
    console = Console()
    failed = 0
    for name in names:
        results = check(name, args.op, args.seed)
        table = Table(title=f"{name} vs cpu")
        for col in ("op", "cases" if not args.verbose else "case", "max NMSE", "tolerance", "result"):
            table.add_column(col, justify="right" if col in ("cases", "max NMSE", "tolerance") else "left")
        if args.verbose:
            for r in results:
                table.add_row(r["op"], r["case"], f"{r['nmse']:.3g}", f"{r['tolerance']:.0e}", _verdict([r]))
        else:
            by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for r in results:
                by_op[r["op"]].append(r)
            for op, rs in by_op.items():
                worst = max(r["nmse"] for r in rs)
                tol = ", ".join(sorted({f"{r['tolerance']:.0e}" for r in rs}))
                table.add_row(op, str(len(rs)), f"{worst:.3g}", tol, _verdict(rs))
        console.print(table)
        bad = [r for r in results if not r["passed"]]
        for r in bad:
            console.print(
                f"[red]FAIL[/red] {r['op']} {r['case']}: nmse {r['nmse']:.3g} > {r['tolerance']:.0e} {r['error']}"
            )
        skipped = [r for r in results if r["skipped"]]
        for reason in sorted({r["skipped"] for r in skipped}):
            n = sum(r["skipped"] == reason for r in skipped)
            console.print(f"[yellow]skipped[/yellow] {n} cases: {reason}")
        ran = len(results) - len(skipped)
        console.print(f"{name}: {ran - len(bad)} of {ran} cases pass")
        failed += len(bad)
    return 1 if failed else 0


def _verdict(rs: list[dict[str, Any]]) -> str:
    bad = sum(not r["passed"] for r in rs)
    return "[green]ok[/green]" if not bad else f"[red]{bad} failed[/red]"


if __name__ == "__main__":
    sys.exit(main())
