"""regolith: run huge sparse Mixture-of-Experts language models on machines far smaller than the model."""

from . import antislop, gguf, memory_plan, model_sizes, models, pack, prompt_cache, quant, sampling, state
from .chat import ChatTemplate, ChatTemplateError
from .errors import (
    ContextOverflowError,
    GGUFError,
    HubError,
    ImageError,
    MemoryPlanError,
    ModelFormatError,
    RegolithError,
    SamplingError,
    SessionError,
)
from .generation import Generation, GenerationStats
from .model import Model
from .prompt_cache import PromptCache
from .sampling import SamplingParams
from .session import Session
from .tokenizer import Tokenizer
from .window import Window, eval_windows

__version__ = "0.1.0"

__all__ = [
    "ChatTemplate",
    "ChatTemplateError",
    "ContextOverflowError",
    "GGUFError",
    "Generation",
    "GenerationStats",
    "HubError",
    "ImageError",
    "MemoryPlanError",
    "Model",
    "ModelFormatError",
    "PromptCache",
    "RegolithError",
    "SamplingError",
    "SamplingParams",
    "Session",
    "SessionError",
    "Tokenizer",
    "Window",
    "__version__",
    "antislop",
    "eval_windows",
    "gguf",
    "memory_plan",
    "model_sizes",
    "models",
    "pack",
    "prompt_cache",
    "quant",
    "sampling",
    "state",
]
