"""Measurement and cost models behind ``hot memory``, ``hot gbops`` and ``hot inspect``."""
