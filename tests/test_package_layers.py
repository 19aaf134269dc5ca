"""The Python package is layered: every module of src/regolith imports only modules of lower layers
(module-level imports, those under ``if TYPE_CHECKING:`` and those inside functions alike), so the import
graph has no cycle and the package reads bottom-up. The layers are those of docs/architecture.md, "Python
layers"; the last test checks that the document lists the same ones.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / "src" / "regolith"

# Bottom to top, as in docs/architecture.md ("Python layers"): the files of src/regolith and the C++
# extension. A module may import modules of earlier layers only, never one of its own layer or a later one.
# A new module needs a place here and in the document.
LAYERS: list[tuple[str, ...]] = [
    ("_core", "errors.py", "_atomic.py", "antislop.py", "model_files.py"),
    (
        "quant.py",
        "scr.py",
        "sampling.py",
        "logprobs.py",
        "chat.py",
        "model_sizes.py",
        "hub.py",
        "backends/__init__.py",
    ),
    ("gguf.py", "backends/check.py", "memory_plan.py"),
    ("tokenizer.py", "vision.py", "state.py", "models.py", "gguf_split.py"),
    ("pack.py", "window.py"),
    ("speculative.py", "prompt_cache.py"),
    ("generation.py",),
    ("model.py",),
    ("session.py", "terminal.py"),
    ("__init__.py",),
    (
        "convert/checkpoint.py",
        "convert/gpt_oss.py",
        "convert/mmproj.py",
        "convert/qwen3.py",
        "convert/qwen_hybrid.py",
        "convert/tokenizer.py",
    ),
    ("convert/qwen4exp.py", "convert/qwen35moe.py", "convert/qwen3next.py"),
    ("convert/writer.py",),
    ("convert/__init__.py",),
    (
        "server/api_error.py",
        "server/affinity.py",
        "server/reply.py",
        "server/metrics.py",
        "server/structured.py",
        "server/grammar.py",
        "server/thinking.py",
        "server/logprobs.py",
        "server/scheduler.py",
    ),
    ("server/engine.py", "server/plan.py"),
    ("server/endpoint.py",),
    ("server/openai_api.py", "server/anthropic_api.py", "server/tokenize_api.py"),
    ("server/app.py",),
    ("server/__init__.py", "server/ray.py", "inspection.py", "cli_options.py"),
    ("cli.py",),
]

# The C++ extension (built from csrc/): a module of the package without a .py file, importing none of it.
EXTENSION = "_core"


def _module(file: str) -> str:
    """'server/app.py' -> 'regolith.server.app', '__init__.py' -> 'regolith', '_core' -> 'regolith._core'."""
    parts = ["regolith", *file.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files() -> dict[str, Path]:
    """Module name -> file, for every .py file of the package."""
    return {_module(p.relative_to(PACKAGE_DIR).as_posix()): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _known() -> set[str]:
    return set(_files()) | {_module(EXTENSION)}


def _imports(module: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """The package modules ``module`` imports anywhere in its file, with the line of each import, relative
    (``from .x import y``) or absolute (``import regolith.x``). ``from X import name`` imports the module
    ``X.name`` when there is one, else the module ``X``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []

    def add(target: str, line: int) -> None:
        if target == "regolith" or target.startswith("regolith."):
            found.append((target, line))

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                source = ".".join(
                    parts[: len(parts) - node.level + 1] + ([node.module] if node.module else [])
                )
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                add(sub if sub in known else source, node.lineno)
    return sorted(set(found))


def _graph() -> dict[str, list[tuple[str, int]]]:
    """Module -> (imported module, line) for every module of the package."""
    known = _known()
    return {m: _imports(m, path, known) for m, path in _files().items()}


def test_every_module_has_one_layer():
    listed = [_module(f) for files in LAYERS for f in files]
    assert len(listed) == len(set(listed)), "a module is listed twice in LAYERS"
    assert sorted(_known() - set(listed)) == [], "modules without a layer: add them to LAYERS and the doc"
    assert sorted(set(listed) - _known()) == [], "LAYERS lists modules that do not exist"


def test_imports_name_modules_of_the_package():
    known = _known()
    unknown = [
        f"{m} line {line}: {t}" for m, edges in _graph().items() for t, line in edges if t not in known
    ]
    assert unknown == []


def test_module_imports_have_no_cycle():
    graph = {m: sorted({t for t, _ in edges}) for m, edges in _graph().items()}
    done: set[str] = set()
    path: list[str] = []

    def cycle_from(m: str) -> list[str] | None:
        path.append(m)
        for t in graph.get(m, ()):
            if t in path:
                return [*path[path.index(t) :], t]
            if t not in done and (cycle := cycle_from(t)) is not None:
                return cycle
        path.pop()
        done.add(m)
        return None

    for m in sorted(graph):
        if m not in done and (cycle := cycle_from(m)) is not None:
            raise AssertionError("import cycle: " + " -> ".join(cycle))


def test_modules_import_only_lower_layers():
    layer = {_module(f): i for i, files in enumerate(LAYERS) for f in files}
    upward = [
        f"{m} (layer {layer[m]}) line {line} imports {t} (layer {layer[t]})"
        for m, edges in sorted(_graph().items())
        for t, line in edges
        if m in layer and t in layer and layer[t] >= layer[m]
    ]
    assert upward == [], "imports that do not go down the layers:\n" + "\n".join(upward)


def test_architecture_doc_lists_the_layers():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert "\n## Python layers\n" in text
    section = text.split("\n## Python layers\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*`([\w./]+)`\s*\|", section, flags=re.MULTILINE)
    documented = [(int(n), file) for n, file in rows]
    assert documented == [(i, f) for i, files in enumerate(LAYERS) for f in files]
