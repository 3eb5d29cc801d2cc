"""Model serving for Basis Expanding SVMs: the pure inference library and the HTTP layer."""

__version__ = "0.1.0"
