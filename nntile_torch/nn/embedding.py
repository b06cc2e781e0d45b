"""nntile_torch.nn.Embedding: a drop-in for torch.nn.Embedding (default options) as tile tasks."""
import torch
from torch import nn

from .. import config
from ..costs import Costs
from ..functional import EmbeddingFunction, apply_tiled, check_indices, check_indices_now  # noqa: F401 (re-exported)
from ..runtime import ensure_init
from ..tensor import TileTensor, without_torch_function
from . import _init


class Embedding(nn.Module):
    """weight[ids] as tile tasks: ids (*) integer -> (*, embedding_dim); weight (num_embeddings, embedding_dim)
    in tiles (tile_size, embedding_dim) (the width must fit in one tile; the same tiling as a tied
    nntile_torch.nn.Linear LM head). torch.nn.Embedding's options beyond the defaults are not supported.
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, device=None, dtype=None, *, tile_size=None,
                 batch_tile_size=None):
        super().__init__()
        if padding_idx is not None or max_norm is not None or scale_grad_by_freq or sparse:
            raise ValueError("nntile_torch.nn.Embedding supports padding_idx=None, max_norm=None, "
                             "scale_grad_by_freq=False, sparse=False only")
        if dtype not in (None, torch.float32):
            raise TypeError(f"nntile_torch.nn.Embedding keeps float32 parameters (got dtype={dtype})")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx, self.max_norm, self.norm_type = None, None, norm_type
        self.scale_grad_by_freq, self.sparse = False, False
        self.tile_size = config.check_tile(tile_size, "tile_size") or config.DEFAULT_TILE_SIZE
        if embedding_dim > self.tile_size:
            raise ValueError(f"embedding_dim ({embedding_dim}) must fit in one tile (tile_size {self.tile_size})")
        self.batch_tile_size = config.check_tile(batch_tile_size, "batch_tile_size") or config.DEFAULT_BATCH_TILE_SIZE
        t = self.tile_size
        self.weight = nn.Parameter(TileTensor.empty((num_embeddings, embedding_dim), (t, t), device, name="weight",
                                                    persistent=True))
        self.reset_parameters()

    def reset_parameters(self):
        if _init.skipping():  # convert() writes the values
            return
        with torch.no_grad():
            self.weight.copy_(torch.randn(self.num_embeddings, self.embedding_dim))

    @without_torch_function
    def forward(self, ids):
        check = check_indices(ids, self.num_embeddings, "Embedding")
        ensure_init()
        if not isinstance(self.weight, TileTensor) or self.weight.tiles.grid[1] != 1:
            check_indices_now(ids, self.num_embeddings, "Embedding")
            return nn.functional.embedding(ids, self.weight)  # a weight tied in another tiling: torch code
        return apply_tiled(EmbeddingFunction, ids, self.weight, self.batch_tile_size, check)

    def plan_costs(self, precision, seq):
        # The ids it keeps for the backward are the model's (costs.language_model counts them once); its weight is
        # read by a lookup, not a matmul (a tied LM head's Linear names it).
        return Costs()

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}, tile_size={self.tile_size}"

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self.weight if keep_vars else self.weight.materialize().clone()
