"""Converting Hugging Face checkpoints to GGUF (``regolith convert``).

``convert(hf_dir, out_path, outtype)`` writes a qwen4_exp checkpoint as a GGUF file in llama.cpp's
``qwen4exp`` layout; :mod:`regolith.convert.qwen4exp` holds the mapping as pure functions. Needs the
``gguf`` package (the writer), not torch.
"""

from .writer import OUTTYPES, convert, tensor_type

__all__ = ["OUTTYPES", "convert", "tensor_type"]
