"""Reading GGUF files (filled in by the GGUF reader work)."""
