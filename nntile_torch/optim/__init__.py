"""Optimizers whose update runs as tile tasks where the tiles are."""
from .adamw import AdamW
from . import torch_optim  # noqa: F401  (torch's own optimizers over tile parameters: fused ops, state hooks)

__all__ = ["AdamW"]
