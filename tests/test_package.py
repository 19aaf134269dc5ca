"""The installed package carries its typing information: py.typed and the extension's generated stubs."""

from __future__ import annotations

from pathlib import Path

import regolith
from regolith import _core


def test_py_typed_and_core_stubs_are_installed():
    assert (Path(regolith.__file__).parent / "py.typed").is_file()
    stub = Path(_core.__file__).parent / "_core.pyi"
    text = stub.read_text()
    # The stub is generated from the built module, so it names what the module defines.
    for name in ("class GGUFSet", "class ModelWindow", "def eval(", "def truncate("):
        assert name in text, name
    assert all(n in dir(_core) for n in ("GGUFSet", "ModelWindow"))
