"""Optimizers whose update runs as tile tasks where the tiles are."""
from .adamw import AdamW

__all__ = ["AdamW"]
