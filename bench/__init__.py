"""Benchmark suite: elastic-train against bare torchrun (``python -m bench``)."""
