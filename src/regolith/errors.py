"""The regolith exception hierarchy."""


class RegolithError(Exception):
    """Base class of every error regolith raises on purpose."""


class GGUFError(RegolithError, ValueError):
    """A GGUF file is malformed, truncated or uses something regolith does not support.

    The message names the problem and the byte offset in the file where it was found.
    """


class ModelFormatError(RegolithError, ValueError):
    """A model file is well-formed but does not describe a model regolith can run as stated."""


class SamplingError(RegolithError, ValueError):
    """Logits the sampler cannot draw from: NaN or +inf values, or no token left (all banned or -inf)."""


class ContextOverflowError(RegolithError, ValueError):
    """A prompt (or a prompt plus its reply) does not fit in the context window."""


class SessionError(RegolithError, ValueError):
    """A saved window or session state cannot be restored: not a state file, another format version or model,
    truncated or corrupt (checksums), or not fitting the window it is restored into."""


class MemoryPlanError(RegolithError, ValueError):
    """The model does not fit the memory budget asked for (``memory_gb``, ``arena_gb``); the message holds the
    plan."""


class HubError(RegolithError):
    """A model cannot be downloaded from the Hugging Face Hub: the repository or quantization is not there, the
    Hub cannot be reached, the disk is too small, or a downloaded file's sha256 differs from the Hub's."""


class ImageError(RegolithError, ValueError):
    """An image that cannot be used: corrupt or truncated data, an unsupported format, too many pixels, a
    remote URL (never fetched), or a model without vision support."""
