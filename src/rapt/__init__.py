"""rapt: privacy-preserving customization of hosted language models."""

__version__ = "0.1.0"
