"""Converting Hugging Face checkpoints to GGUF (``regolith convert``)."""
