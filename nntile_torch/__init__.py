"""nntile_torch: PyTorch models trained as StarPU tasks over tiles, on CPUs and GPUs, beyond GPU memory."""
import torch  # noqa: F401  (loads libtorch and, in CUDA builds, the cuBLAS/cudart that _C links against)

from . import _C  # noqa: F401  (nt._C, the native module)
from .runtime import (info, init, is_running, memory_advice, memory_nodes, memory_nodes_report, memory_summary,
                      reset_peak_stats, shutdown, stats, synchronize, task_trace)
from .tensor import TileTensor
from .param import ParamState, param_state
from . import pointwise  # noqa: F401  (pointwise ops and norms of TileTensors as tasks: torch's optimizers, clipping)
from . import nn, optim  # noqa: E402  (need the runtime and TileTensor)
from .convert import convert  # noqa: E402
from .plan import InsufficientMemoryError, MemoryPlan, plan  # noqa: E402
from .report import ConvertReport, DenseFallbackError, convert_report  # noqa: E402
from .streaming import streamer  # noqa: E402

__version__ = "0.1.0"
__all__ = ["init", "shutdown", "info", "stats", "reset_peak_stats", "memory_nodes", "memory_nodes_report",
           "memory_advice", "memory_summary", "synchronize", "task_trace", "is_running", "TileTensor", "ParamState",
           "param_state", "nn", "optim", "convert", "plan", "streamer", "MemoryPlan", "InsufficientMemoryError",
           "convert_report", "ConvertReport", "DenseFallbackError"]
