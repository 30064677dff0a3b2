"""Benchmarks: run with ``python -m bench.<name>``; they print what they measured."""
