"""The smoke checks' names: one list for the driver (smoke/__init__.py) and the ranks (smoke/rank.py)."""

RANK_CHECKS = ("mapping", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "ddp", "bandwidth")
"""Run inside every rank, in this order."""
DRIVER_CHECKS = ("isolation", "timing")
"""Judged by the driver from what the ranks recorded."""
