"""Drop-in replacements for torch.nn modules, executed as tile tasks."""
from .linear import Linear

__all__ = ["Linear"]
