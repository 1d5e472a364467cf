"""ds4tui — run DeepSeek V4 Flash locally with DSpark speculative decoding, and see it."""

__version__ = "0.2.0"
