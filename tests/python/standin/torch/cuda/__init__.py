"""torch.cuda: lazy initialisation, and the memory API of memory.py."""
from .. import _C
from . import memory
from .memory import (caching_allocator_alloc, caching_allocator_delete,  # noqa
                     empty_cache, max_memory_allocated, max_memory_reserved,
                     memory_allocated, memory_reserved, memory_snapshot,
                     memory_stats, memory_summary, reset_accumulated_memory_stats,
                     reset_peak_memory_stats, set_per_process_memory_fraction)
from .graphs import CUDAGraph, graph_pool_handle  # noqa: F401

OutOfMemoryError = _C.OutOfMemoryError


def is_initialized():
    return _C._State.initialized


def _lazy_init():
    _C._cuda_init()


def current_device():
    _lazy_init()
    return 0


def device_count():
    return 1


def _get_device_index(device, optional=False):
    if device is None:
        return current_device()
    return int(device)
