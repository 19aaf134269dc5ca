"""The dequantized twin of a GGUF: the same metadata, every tensor as f32 (regolith's dequantization).

A quantized model and its twin compute the same function when regolith multiplies with float activations
(exact mode), so comparing them checks that every layer decodes its quantized weights correctly; the twin
itself runs the f32 path that the transformers tests check.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

import regolith


def write_dequantized_twin(src: str | Path, dst: str | Path, drop: str | None = None) -> Path:
    """Write the twin of ``src`` to ``dst`` (without tensor ``drop``, to make a broken file)."""
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(key, field.contents(), vtype)
    with regolith.gguf.open(src) as f:
        for name in f.tensors:
            if name == drop:
                continue
            w.add_tensor(name, np.ascontiguousarray(f.tensor(name)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)
