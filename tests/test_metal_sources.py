"""The Metal kernels as source, checked without a Mac (docs/metal.md says what this does and does not prove).

Every metal/*.metal is parsed by clang (the libclang package) as the Metal compiler would see it, with
Metal's address spaces as clang address spaces (metal/check/metal_stdlib), no C or C++ library and no double:
what Metal rejects for those reasons clang rejects here. The emulator's conventions (buffer indices equal to
parameter positions, RG_THREAD_IDS last, every kernel registered under a name) are checked on the text."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNEL_FILES = sorted((ROOT / "metal").glob("*.metal"))

cindex = pytest.importorskip("clang.cindex")

CHECK_ARGS = [
    "-x",
    "c++",
    "-std=c++17",
    "-nostdinc",
    "-nostdinc++",
    "-D__METAL_VERSION__=310",
    "-DRG_METAL_CHECK=1",
    f"-I{ROOT / 'metal' / 'check'}",
    f"-I{ROOT / 'csrc'}",
    f"-I{ROOT / 'metal'}",
    "-Wall",
    "-Wno-unknown-attributes",
    "-Wno-unused-function",
    "-fsyntax-only",
]


def clang_diagnostics(path: Path) -> list[str]:
    tu = cindex.Index.create().parse(str(path), args=CHECK_ARGS)
    return [
        f"{d.location.file}:{d.location.line}: {d.spelling}"
        for d in tu.diagnostics
        if d.severity >= cindex.Diagnostic.Warning
    ]


def test_there_are_kernel_files():
    names = {p.stem for p in KERNEL_FILES}
    assert {"copy", "norm"} <= names


@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: p.name)
def test_kernels_pass_the_metal_address_space_check(path):
    problems = clang_diagnostics(path)
    assert not problems, "\n".join(problems)


def test_the_kernel_files_compile_as_one_library(tmp_path):
    """Where the package was built without the Metal toolchain, the kernels are compiled at load as one source
    (cmake/metal_embed.py): the files must not define the same names twice."""
    spec = importlib.util.spec_from_file_location("metal_embed", ROOT / "cmake" / "metal_embed.py")
    embed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(embed)
    src = tmp_path / "library.metal"
    src.write_text(embed.library_source())
    problems = clang_diagnostics(src)
    assert not problems, "\n".join(problems)
    assert all(f"// ---- metal/{p.name}" in src.read_text() for p in KERNEL_FILES)


def test_the_embedded_library_compiles_into_the_extension(tmp_path):
    """An Apple build without the Metal toolchain compiles cmake/metal_embed.py's C++ file into the extension
    (cmake/metal.cmake): a valid C++ source whose string is the library source."""
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not compiler:
        pytest.skip("no C++ compiler")
    cpp = tmp_path / "metal_library_source.cpp"
    subprocess.run([sys.executable, str(ROOT / "cmake" / "metal_embed.py"), str(cpp)], check=True)
    subprocess.run([compiler, "-std=c++17", "-fsyntax-only", str(cpp)], check=True)
    text = cpp.read_text()
    assert "const char* metal_library_source()" in text and "kernel void rg_rms_norm(" in text


def test_the_check_catches_what_metal_rejects(tmp_path):
    """The stand-in library makes clang reject the errors it exists for (so a clean parse means something)."""
    bad = {
        "device pointer where a threadgroup one is expected": """
            void f(threadgroup float* p);
            kernel void k(device float* x [[buffer(0)]]) { f(x); }""",
        "a threadgroup variable declared in a kernel": """
            kernel void k(device float* x [[buffer(0)]]) { threadgroup float t[4]; t[0] = x[0]; x[0] = t[0]; }""",
        "double": """
            kernel void k(device float* x [[buffer(0)]]) { double d = x[0]; x[0] = float(d); }""",
        "the C++ library": """
            #include <cmath>
            kernel void k(device float* x [[buffer(0)]]) { x[0] = 1.0f; }""",
    }
    for what, body in bad.items():
        src = tmp_path / "bad.metal"
        src.write_text('#include "compat.h"\n' + body)
        errors = [
            d for d in cindex.Index.create().parse(str(src), args=CHECK_ARGS).diagnostics if d.severity >= 3
        ]
        assert errors, f"the check accepts {what}"


KERNEL = re.compile(r"kernel\s+void\s+(\w+)\s*\((.*?)\)\s*\{", re.DOTALL)


def kernel_signatures(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in KERNEL.finditer(text)]


@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: p.name)
def test_kernel_parameters_follow_the_emulator_conventions(path):
    text = path.read_text()
    sigs = kernel_signatures(text)
    assert sigs, f"{path.name} defines no kernel"
    for name, params in sigs:
        parts = [p.strip() for p in params.split(",")]
        assert parts[-1] == "RG_THREAD_IDS", f"{name}: RG_THREAD_IDS must be its last parameter"
        for i, p in enumerate(parts[:-1]):
            m = re.search(r"\[\[buffer\((\d+)\)\]\]", p)
            assert m and int(m.group(1)) == i, f"{name}: parameter {i} ({p}) must be [[buffer({i})]]"
            assert re.match(r"(device|constant)\b", p), f"{name}: parameter {i} ({p}) names no address space"
        # RG_INSTANTIATE("name", fn, ...), or with a name built by a list macro: ("prefix_" #type, fn, ...)
        registered = re.search(rf'RG_KERNEL\({name}\)|RG_INSTANTIATE\("\w+"(\s*#\s*\w+)?,\s*{name}\b', text)
        assert registered, f"{name} is never registered (RG_KERNEL / RG_INSTANTIATE)"
