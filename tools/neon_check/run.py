"""Test the arm64 NEON kernels on an x86 machine: cross-compile the CPU backend for aarch64 (the baseline
ARMv8-A build with its second NEON set for the dot-product extension, as CMake builds it), run it under
qemu on random valid weights of every type, and check the scalar, NEON and NEON dot-product kernels against
the float64 reference with the bounds of tests/test_matmul.py. A second run on an emulated Cortex-A53
(no dot product) checks that the run-time detection leaves that set out.

    apt-get install g++-aarch64-linux-gnu qemu-user
    python tools/neon_check/run.py
    python tools/neon_check/run.py --emulator   # the Metal emulator's fibers and self-test kernels instead
"""

from __future__ import annotations

import argparse
import glob
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)

from regolith.quant import TYPE_IDS, type_size
from tests.quant_data import (
    QUANT_TYPES,
    decomposition_magnitudes,
    q8_exact_activations,
    random_matrix,
    reference,
)

EPS32 = float(np.finfo(np.float32).eps)


ISAS = ("scalar", "neon", "neondot")


def build(out: str) -> None:
    sources = glob.glob(f"{ROOT}/csrc/core/*.cpp") + [
        s
        for s in glob.glob(f"{ROOT}/csrc/cpu/*.cpp")
        if not s.endswith(("_avx2.cpp", "_avxvnni.cpp", "_avx512.cpp", "_neondot.cpp"))
    ]
    # the backend registry asks for the CUDA and Metal backends; this build has neither
    sources += [f"{ROOT}/csrc/cuda/no_cuda.cpp", f"{ROOT}/csrc/metal/no_metal.cpp"]
    cxx = ["aarch64-linux-gnu-g++", "-std=c++17", "-O2", "-ffp-contract=off", "-pthread"]
    cxx += ["-DRG_HAVE_NEON=1", "-DRG_HAVE_NEONDOT=1", f"-I{ROOT}/csrc"]
    dot = out + "-neondot.o"
    for src in glob.glob(f"{ROOT}/csrc/cpu/*_neondot.cpp"):
        subprocess.run([*cxx, "-march=armv8.2-a+dotprod", "-c", src, "-o", dot], check=True)
    cmd = [*cxx, "-march=armv8-a", "-static", *sources, dot, f"{ROOT}/tools/neon_check/driver.cpp", "-o", out]
    subprocess.run(cmd, check=True)


def run_emulator() -> int:
    """The Metal emulator's self-test kernels on arm64 (its fibers switch stacks in per-architecture
    assembly), checked by emu_driver.cpp."""
    emu = f"{ROOT}/csrc/metal/emu"
    sources = [f"{emu}/{f}.cpp" for f in ("fiber", "threadgroup", "emu_device", "selftest_kernels")]
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "emu_check")
        cmd = ["aarch64-linux-gnu-g++", "-std=c++17", "-O2", "-static", "-pthread", "-Wno-attributes"]
        cmd += [f"-I{ROOT}/csrc", f"-I{ROOT}", *sources, f"{ROOT}/csrc/core/thread_pool.cpp"]
        subprocess.run([*cmd, f"{ROOT}/tools/neon_check/emu_driver.cpp", "-o", exe], check=True)
        return subprocess.run(["qemu-aarch64", exe], check=False).returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--emulator", action="store_true", help="check the Metal emulator on arm64 instead")
    args = ap.parse_args()
    if args.emulator:
        return run_emulator()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "neon_check")
        build(exe)
        cases = []
        for name in QUANT_TYPES:
            qk, _ = type_size(name)
            for ntok in (1, 3, 8, 11):
                rows, cols = 9, max(qk, 256) * 2
                wq = random_matrix(name, rows, cols, rng)
                x = q8_exact_activations(ntok, cols, rng)
                path = os.path.join(tmp, f"{name}-{ntok}.case")
                with open(path, "wb") as f:
                    f.write(struct.pack("<I4q", TYPE_IDS[name], rows, cols, ntok, wq.shape[1]))
                    f.write(wq.tobytes())
                    f.write(x.tobytes())
                cases.append((name, path, wq, x, rows, cols, ntok))
        subprocess.run(["qemu-aarch64", "-cpu", "max", exe, *[c[1] for c in cases]], check=True)
        failures = 0
        for name, path, wq, x, rows, cols, ntok in cases:
            ref = x.astype(np.float64) @ reference(wq, name).astype(np.float64).T
            sq, b = decomposition_magnitudes(TYPE_IDS[name], wq, rows, cols)
            bound = (cols / 16 + 8) * EPS32 * ((sq + b) @ np.abs(x.astype(np.float64)).T).T
            for isa in ISAS:
                y = np.fromfile(f"{path}.{isa}.out", dtype=np.float32).reshape(ntok, rows)
                if not np.all(np.abs(y - ref) <= bound):
                    failures += 1
                    print(f"FAIL {isa} {name} ntok={ntok}: max excess {np.max(np.abs(y - ref) - bound):.3g}")
        # a CPU without the dot product: the driver must not offer that set
        a53 = os.path.join(tmp, "a53.case")
        with open(a53, "wb") as f, open(cases[0][1], "rb") as src:
            f.write(src.read())
        subprocess.run(["qemu-aarch64", "-cpu", "cortex-a53", exe, a53], check=True)
        offered = [isa for isa in ISAS if os.path.exists(f"{a53}.{isa}.out")]
        if offered != ["scalar", "neon"]:
            failures += 1
            print(f"FAIL detection: a Cortex-A53 was offered {offered}, expected scalar and neon")
        print(f"{len(cases) * len(ISAS) + 1 - failures} passed, {failures} failed")
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
