"""Drop-in replacements for torch.nn modules, executed as tile tasks."""
from .linear import Conv1D, Linear

__all__ = ["Linear", "Conv1D"]
