"""regolith: run huge sparse Mixture-of-Experts language models on machines far smaller than the model."""

from . import antislop, gguf, models, quant, sampling
from .chat import ChatTemplate, ChatTemplateError
from .errors import ContextOverflowError, GGUFError, ModelFormatError, RegolithError, SamplingError
from .generation import Generation, GenerationStats
from .model import Model, Window
from .sampling import SamplingParams
from .session import Session
from .tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = [
    "ChatTemplate",
    "ChatTemplateError",
    "ContextOverflowError",
    "GGUFError",
    "Generation",
    "GenerationStats",
    "Model",
    "ModelFormatError",
    "RegolithError",
    "SamplingError",
    "SamplingParams",
    "Session",
    "Tokenizer",
    "Window",
    "__version__",
    "antislop",
    "gguf",
    "models",
    "quant",
    "sampling",
]
