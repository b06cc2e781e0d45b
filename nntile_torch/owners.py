"""What nntile_torch keeps about the user's own objects (modules, optimizers, their step counters), beside them
rather than as private attributes on them: one record per object in a weak dictionary (it lives as long as the
object), each field written by the one module named beside it. A parameter's placement and state have their own
owner, param.ParamState (param._nntile_state, the one attribute nntile_torch sets on a user's object)."""
import weakref

from torch.utils.weak import WeakIdKeyDictionary


class ModuleRecord:
    """What nntile_torch knows about one nn.Module: a converted model, one of its blocks, an embedding."""
    __slots__ = ("report", "backward_marked", "streamer", "checkpointed", "index_checked")

    def __init__(self):
        self.report = None  # report.py: the converted model's ConvertReport (convert_report())
        self.backward_marked = False  # report.py: the forward hook that marks the model's backward is on
        self.streamer = None  # streaming.py: the memory plan's Streamer on the converted model (streamer())
        self.checkpointed = False  # streaming.py: the block's forward runs under torch.utils.checkpoint
        self.index_checked = False  # convert.py: an nn.Embedding left dense checks its indices first


class OptimizerRecord:
    """What nntile_torch knows about one torch.optim optimizer stepping tile parameters (optim/torch_optim.py)."""
    __slots__ = ("seen_state", "hooked")

    def __init__(self):
        self.seen_state = None  # the optimizer.state whose dense states were put back into tiles
        self.hooked = False  # state_dict()'s post-hook that hands out dense states is registered


class CacheLayerRecord:
    """What nntile_torch keeps about one layer of Hugging Face's key/value cache (nn/kv_cache.py)."""
    __slots__ = ("tiles", "views", "length")

    def __init__(self):
        self.tiles = None  # kv_cache.py: the tiles the attention reads (GPT-2's qkv rows; Llama's k and v), each
        #                    (B, room, C) with room >= length positions per sequence
        self.views = None  # kv_cache.py: the (keys, values) views of them it set on the layer
        self.length = 0  # kv_cache.py: the positions per sequence so far


# C++ tiles -> the pending.Producer that owes their values (docs/fusion.md): written by pending.py alone, read by
# TileTensor's one accessor of its tiles (tensor.py), which flushes the producer first. Weak: tiles that die unread
# take their producer with them (nothing can read them any more).
PENDING = weakref.WeakKeyDictionary()
_MODULES = weakref.WeakKeyDictionary()
_CACHE_LAYERS = WeakIdKeyDictionary()  # by identity: a cache layer is the user's object, its == not ours
_OPTIMIZERS = weakref.WeakKeyDictionary()
# an optimizer's step counters (tensors: keyed by identity, torch's == is elementwise) -> (version, value) when read
STEP_VALUES = WeakIdKeyDictionary()


def module_record(module, create=True):
    """The ModuleRecord of `module` (a new one unless create=False: then None when it has none)."""
    record = _MODULES.get(module)
    if record is None and create:
        record = _MODULES[module] = ModuleRecord()
    return record


def optimizer_record(optimizer):
    """The OptimizerRecord of `optimizer` (a new one the first time)."""
    record = _OPTIMIZERS.get(optimizer)
    if record is None:
        record = _OPTIMIZERS[optimizer] = OptimizerRecord()
    return record


def cache_layer_record(layer, create=True):
    """The CacheLayerRecord of a key/value cache layer (a new one unless create=False: then None when it has none)."""
    record = _CACHE_LAYERS.get(layer)
    if record is None and create:
        record = _CACHE_LAYERS[layer] = CacheLayerRecord()
    return record
