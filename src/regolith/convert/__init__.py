"""Converting Hugging Face checkpoints to GGUF (``regolith convert``).

``convert(hf_dir, out_path, outtype)`` writes a qwen4_exp checkpoint as a GGUF file in llama.cpp's
``qwen4exp`` layout (``mmproj=``: and its vision tower as llama.cpp's projector GGUF, :func:`convert_mmproj`);
:mod:`regolith.convert.qwen4exp` and :mod:`regolith.convert.mmproj` hold the mappings as pure functions. Needs the
``gguf`` package (the writer), not torch.
"""

from .writer import OUTTYPES, convert, convert_mmproj, tensor_type

__all__ = ["OUTTYPES", "convert", "convert_mmproj", "tensor_type"]
