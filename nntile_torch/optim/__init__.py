"""Optimizers whose update runs as tile tasks where the tiles are."""
from .adamw import AdamW, state_bytes_per_param
from . import torch_optim  # noqa: F401  (torch's own optimizers over tile parameters: fused ops, state hooks)

__all__ = ["AdamW", "state_bytes_per_param"]
