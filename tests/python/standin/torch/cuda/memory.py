"""torch/cuda/memory.py's functions that xseg_torch reaches, each calling
torch._C as PyTorch's does (through the module at call time)."""
import collections
import ctypes
import pickle

import torch


def caching_allocator_alloc(size, device=None, stream=None):
    return torch._C._cuda_cudaCachingAllocator_raw_alloc(size, stream)


def caching_allocator_delete(mem_ptr):
    torch._C._cuda_cudaCachingAllocator_raw_delete(mem_ptr)


def set_per_process_memory_fraction(fraction, device=None):
    torch.cuda._lazy_init()
    device = torch.cuda._get_device_index(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError("Invalid fraction value: %s. Allowed range: 0~1" %
                         fraction)
    torch._C._cuda_setMemoryFraction(fraction, device)


def empty_cache():
    if torch.cuda.is_initialized():
        torch._C._cuda_emptyCache()


def memory_stats_as_nested_dict(device=None):
    if not torch.cuda.is_initialized():
        return {}
    device = torch.cuda._get_device_index(device, optional=True)
    return torch._C._cuda_memoryStats(device)


def memory_stats(device=None):
    flat = []

    def walk(prefix, obj):
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(prefix + ("." if prefix else "") + str(k), v)
        else:
            flat.append((prefix, obj))
    walk("", memory_stats_as_nested_dict(device))
    flat.sort()
    return collections.OrderedDict(flat)


def reset_accumulated_memory_stats(device=None):
    device = torch.cuda._get_device_index(device, optional=True)
    return torch._C._cuda_resetAccumulatedMemoryStats(device)


def reset_peak_memory_stats(device=None):
    device = torch.cuda._get_device_index(device, optional=True)
    return torch._C._cuda_resetPeakMemoryStats(device)


def memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def memory_summary(device=None, abbreviated=False):
    """The keys PyTorch's summary reads, every one of them (a missing key is
    its KeyError)."""
    stats = memory_stats(device)
    lines = ["CUDA OOMs: %d | cudaMalloc retries: %d" %
             (stats["num_ooms"], stats["num_alloc_retries"])]
    for metric in ("allocated_bytes", "active_bytes", "requested_bytes",
                   "reserved_bytes", "inactive_split_bytes", "allocation",
                   "active", "segment", "inactive_split"):
        for scope in ("all", "large_pool", "small_pool"):
            prefix = "%s.%s." % (metric, scope)
            lines.append("%s %d %d %d %d" % (
                prefix, stats[prefix + "current"], stats[prefix + "peak"],
                stats[prefix + "allocated"], stats[prefix + "freed"]))
    for metric in ("oversize_allocations", "oversize_segments"):
        lines.append("%s %d %d %d %d" % (
            metric, stats[metric + ".current"], stats[metric + ".peak"],
            stats[metric + ".allocated"], stats[metric + ".freed"]))
    return "\n".join(lines)


def memory_snapshot(mempool_id=None, include_traces=True):
    pool = (0, 0) if mempool_id is None else mempool_id
    return torch._C._cuda_memorySnapshot(
        (pool[0], pool[1], include_traces))["segments"]


def _record_memory_history(enabled="all", *args, **kwargs):
    if isinstance(enabled, bool):
        return _record_memory_history_legacy(enabled, *args, **kwargs)
    return _record_memory_history_impl(enabled, *args, **kwargs)


def _record_memory_history_legacy(enabled, record_context=True,
                                  trace_alloc_max_entries=1,
                                  trace_alloc_record_context=False,
                                  device=None, record_context_cpp=False,
                                  clear_history=False, compile_context=False,
                                  global_record_annotations=False,
                                  skip_actions=None):
    torch._C._cuda_record_memory_history_legacy(
        enabled, record_context, trace_alloc_max_entries,
        trace_alloc_record_context, record_context_cpp, clear_history,
        compile_context, global_record_annotations,
        skip_actions if skip_actions is not None else [])


def _record_memory_history_impl(enabled="all", context="all", stacks="all",
                                max_entries=2**63 - 1, device=None,
                                clear_history=False, compile_context=False,
                                global_record_annotations=False,
                                skip_actions=None):
    torch._C._cuda_record_memory_history(
        enabled, context, stacks, max_entries, clear_history, compile_context,
        global_record_annotations,
        skip_actions if skip_actions is not None else [])


def _snapshot(device=None):
    return torch._C._cuda_memorySnapshot(None)


def _dump_snapshot(filename="dump_snapshot.pickle"):
    s = _snapshot()
    with open(filename, "wb") as f:
        pickle.dump(s, f)


class _CUDAAllocator:
    def __init__(self, allocator):
        self._allocator = allocator

    def allocator(self):
        return self._allocator


class CUDAPluggableAllocator(_CUDAAllocator):
    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        allocator = ctypes.CDLL(path_to_so_file)
        alloc_fn = ctypes.cast(getattr(allocator, alloc_fn_name),
                               ctypes.c_void_p).value
        free_fn = ctypes.cast(getattr(allocator, free_fn_name),
                              ctypes.c_void_p).value
        assert alloc_fn is not None
        assert free_fn is not None
        self._allocator = torch._C._cuda_customAllocator(alloc_fn, free_fn)


def change_current_allocator(allocator):
    torch._C._cuda_changeCurrentAllocator(allocator.allocator())
