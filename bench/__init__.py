"""Lockkeeper's benchmark suite: ``python -m bench [--quick]``.

Every figure is a ratio against a baseline measured in the same run: the two sides
alternate (A B A B ...) and each side's median is quoted. See docs/benchmarks.md.
"""
