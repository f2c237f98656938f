"""The release this stand-in follows (TensorRT-LLM 1.2.1, tag v1.2.1, commit 376f7e1b)."""

__version__ = "1.2.1"
