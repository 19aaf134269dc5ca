"""Converting Hugging Face checkpoints to GGUF (``regolith convert``).

``convert(hf_dir, out_path, outtype)`` writes a qwen4_exp, qwen3, qwen3_moe, qwen3_5_moe, qwen3_next or
gpt_oss checkpoint as a GGUF file in llama.cpp's layout for it (``mmproj=``: and a qwen4_exp vision tower as
llama.cpp's projector GGUF, :func:`convert_mmproj`); :mod:`regolith.convert.qwen4exp`,
:mod:`regolith.convert.qwen3`, :mod:`regolith.convert.qwen35moe`, :mod:`regolith.convert.qwen3next`,
:mod:`regolith.convert.gpt_oss` (MXFP4 experts repacked, not dequantized) and :mod:`regolith.convert.mmproj`
hold the mappings as pure functions.
Needs the ``gguf`` package (the writer), not torch.
"""

from .writer import OUTTYPES, convert, convert_mmproj, tensor_type

__all__ = ["OUTTYPES", "convert", "convert_mmproj", "tensor_type"]
