"""kimipipe: OpenRouter answers turned into EAGLE-3 training data (see README.md)."""

__version__ = "0.1.0"
