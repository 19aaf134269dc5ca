"""regolith: run huge sparse Mixture-of-Experts language models on machines far smaller than the model."""

from . import antislop, gguf, models, quant, sampling
from .errors import GGUFError, ModelFormatError, RegolithError, SamplingError
from .model import Model, Window

__version__ = "0.1.0"

__all__ = [
    "GGUFError",
    "Model",
    "ModelFormatError",
    "RegolithError",
    "SamplingError",
    "Window",
    "__version__",
    "antislop",
    "gguf",
    "models",
    "quant",
    "sampling",
]
