"""Drop-in replacements for torch.nn modules, executed as tile tasks."""
from .embedding import Embedding
from .linear import Conv1D, Linear
from .norm_act import GELU, Dropout, LayerNorm
from .rmsnorm import RMSNorm

__all__ = ["Linear", "Conv1D", "LayerNorm", "GELU", "Embedding", "Dropout", "RMSNorm"]
