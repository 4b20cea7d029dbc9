"""xseg as PyTorch's CUDA allocator.

    import xseg_torch
    xseg_torch.install()          # before the first CUDA tensor
    x = torch.empty(1 << 20, device="cuda")

install() makes xseg torch.cuda's allocator through
torch.cuda.memory.CUDAPluggableAllocator, with every hook PyTorch's
_CUDAPluggableAllocator takes: malloc and free, record_stream, reset
(torch.cuda.empty_cache), memory fraction
(torch.cuda.set_per_process_memory_fraction), init, and the CUDA graph pools
(torch.cuda.graph, MemPool), whose filter (a capture's streams, a
use_mem_pool's thread), asked at every allocation, decides which
allocations go into the pool. The hooks are libxseg_torch.so's C++ wrappers
(torch_adapter/xseg_torch.h), which throw at the failing call: an allocation
xseg cannot serve raises torch.cuda.OutOfMemoryError (xseg_torch_oom.cc,
compiled once by xseg_torch_oom.py against the installed torch when a C++
compiler is present;
otherwise a RuntimeError whose message starts "CUDA out of memory."), in the
thread that asked, autograd's included.

PyTorch answers its memory functions for a pluggable allocator with "does not
yet support", so install() also makes torch._C's functions beneath them
answer with xseg's numbers: memory_stats, memory_allocated, memory_reserved
and their max_ and reset_ forms, memory_summary, memory_snapshot,
torch.cuda.memory._snapshot, _record_memory_history and _dump_snapshot
(a pickle torch.cuda._memory_viz and pytorch.org/memory_viz open).
install(patch_memory_api=False) leaves torch._C alone.

Supported: PyTorch 2.3 up to (not including) 3.0, on Linux x86-64.

The libraries are found from XSEG_LIBRARY / XSEG_TORCH_LIBRARY, else
relative to this file (installed as <prefix>/lib/xseg/python/, or python/
beside build/ in a source tree), else by the dynamic loader.
Configuration comes from XSEG_ALLOC_CONF, as for xseg_create.
"""

import ctypes
import json
import os
import re
import sys

import xseg_torch_oom

__all__ = ["Library", "OutOfMemoryError", "XsegError", "install",
           "installed", "library", "memory_stats", "memory_snapshot",
           "reset_peak_memory_stats", "reset_accumulated_memory_stats",
           "record_memory_history", "empty_cache", "check",
           "raise_if_failed", "SUPPORTED_TORCH"]

# [first, last) of the torch versions install() accepts: the setters of
# _CUDAPluggableAllocator for the graph pools exist from 2.3 on, and the
# hook signatures of torch/csrc/cuda/Module.cpp are unchanged since.
SUPPORTED_TORCH = ((2, 3), (3, 0))
# _record_memory_history's default max_entries is sys.maxsize; xseg keeps
# its ring in host memory allocated up front, so it is capped.
MAX_TRACE_ENTRIES = 1 << 20


class XsegError(RuntimeError):
    """A failure of an xseg entry point other than running out of memory."""


def _oom_class():
    try:
        import torch
        return torch.cuda.OutOfMemoryError
    except (ImportError, AttributeError):
        return None


class OutOfMemoryError(_oom_class() or RuntimeError):
    """torch.cuda.OutOfMemoryError when torch is importable, with xseg's
    message; raised by this module's own calls (raise_if_failed)."""


def _library_dirs():
    here = os.path.dirname(os.path.abspath(__file__))
    # Installed as <prefix>/lib/xseg/python/xseg_torch.py; or in a source
    # tree beside build/.
    for rel in ("../..", "../build", "../build/torch_adapter"):
        yield os.path.normpath(os.path.join(here, rel))


def _find(env, name):
    path = os.environ.get(env)
    if path:
        return path
    for d in _library_dirs():
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    return name


class Library:
    """libxseg.so's xseg_torch_* entry points, typed for ctypes."""

    def __init__(self, path=None):
        self.path = path or _find("XSEG_LIBRARY", "libxseg.so.0")
        self.lib = lib = ctypes.CDLL(self.path, mode=ctypes.RTLD_GLOBAL)
        vp, cp, i, d = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, \
            ctypes.c_double
        sz = ctypes.c_size_t
        self._sig("xseg_torch_malloc", vp, ctypes.c_ssize_t, i, vp)
        self._sig("xseg_torch_free", None, vp, ctypes.c_ssize_t, i, vp)
        self._sig("xseg_torch_record_stream", None, vp, vp)
        self._sig("xseg_torch_empty_cache", None)
        self._sig("xseg_torch_empty_cache_device", i, i, i)
        self._sig("xseg_torch_set_memory_fraction", None, d, i)
        self._sig("xseg_torch_last_error", cp)
        self._sig("xseg_torch_last_status", i)
        self._sig("xseg_torch_clear_error", None)
        self._sig("xseg_torch_allocator", vp, i)
        self._sig("xseg_torch_has_allocator", i, i)
        self._sig("xseg_torch_device_count", i)
        self._sig("xseg_torch_device_limit", i)
        self._sig("xseg_torch_record_memory_history", None, sz)
        self._sig("xseg_torch_pool_id", ctypes.c_uint64, i, ctypes.c_ulonglong,
                  ctypes.c_ulonglong)
        # Returned as void* (not c_char_p) so that they can be freed.
        self._sig("xseg_torch_stats_json", vp, i)
        self._sig("xseg_torch_snapshot_json", vp, i)
        self._sig("xseg_torch_string_free", None, vp)
        self._sig("xseg_check", i, vp)
        self._sig("xseg_last_error", cp)
        self._sig("xseg_reset_peak_stats", i, vp)
        self._sig("xseg_record_memory_history", i, vp, sz)
        self._sig("xseg_empty_cache_blocking", i, vp)
        self._sig("xseg_forget_stream", i, vp, vp)
        self.malloc = lib.xseg_torch_malloc
        self.free = lib.xseg_torch_free
        self.record_stream = lib.xseg_torch_record_stream

    def _sig(self, name, restype, *argtypes):
        fn = getattr(self.lib, name)
        fn.restype = restype
        fn.argtypes = list(argtypes)

    def last_error(self):
        return self.lib.xseg_torch_last_error().decode()

    def clear_error(self):
        self.lib.xseg_torch_clear_error()

    def devices(self):
        """The devices whose allocator exists (used since start)."""
        return [dev for dev in range(self.lib.xseg_torch_device_limit())
                if self.lib.xseg_torch_has_allocator(dev)]

    def device_count(self):
        """Torch's device count (xseg_torch_init's), 0 before its init."""
        return self.lib.xseg_torch_device_count()

    def valid_device(self, device):
        """Raises, as PyTorch's assertValidDevice, for a device torch does
        not have (once its init gave the count)."""
        count = self.device_count()
        if count > 0 and not 0 <= device < count:
            raise RuntimeError("Invalid device argument %d: did you call "
                               "init?" % device)

    def allocator(self, device):
        """Device's xseg_allocator *, created if need be."""
        a = self.lib.xseg_torch_allocator(device)
        if not a:
            raise _error(self.last_error())
        return a

    def call(self, name, device, *args):
        """xseg_<name>(allocator of device, *args); raises on failure."""
        st = getattr(self.lib, "xseg_" + name)(self.allocator(device), *args)
        self.check(st, "xseg_" + name, device)

    def check(self, st, fn, device):
        """Raises XsegError naming fn, device and xseg's message when st, a
        status fn returned for device, is a failure."""
        if st != 0:
            raise XsegError("%s(device %d): %s" % (
                fn, device, self.lib.xseg_last_error().decode()))

    def json(self, what, device):
        fn = getattr(self.lib, "xseg_torch_%s_json" % what)
        text = fn(device)
        if not text:
            raise _error(self.last_error())
        try:
            return json.loads(ctypes.string_at(text).decode())
        finally:
            self.lib.xseg_torch_string_free(text)


def _error(message):
    if "XSEG_ERR_OUT_OF_MEMORY" in message:
        return OutOfMemoryError(message)
    return XsegError(message)


_library = None


def library(path=None):
    """The loaded Library (loaded on first call)."""
    global _library
    if _library is None:
        _library = Library(path)
    return _library


# ---- statistics, PyTorch's keys ---------------------------------------------

# torch/csrc/cuda/Module.cpp's memoryStats: these StatArrays, each
# {all, small_pool, large_pool} x {current, peak, allocated, freed}; the
# counters; max_split_size; and two single Stats xseg does not keep (the
# oversize rules apply to classic segments, uncounted), reported as zero.
_STAT_ARRAYS = ("allocation", "segment", "active", "inactive_split",
                "allocated_bytes", "reserved_bytes", "active_bytes",
                "inactive_split_bytes", "requested_bytes")
_STAT_SCOPES = ("all", "small_pool", "large_pool")
_STAT_METRICS = ("current", "peak", "allocated", "freed")
_COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams",
             "num_device_alloc", "num_device_free")
_UNTRACKED = ("oversize_allocations", "oversize_segments")

# Per device, the accumulated values at the last
# reset_accumulated_memory_stats (xseg's own counters never go back).
_accumulated_base = {}


def _zero_stats():
    stats = {"%s.%s.%s" % (n, s, m): 0 for n in _STAT_ARRAYS
             for s in _STAT_SCOPES for m in _STAT_METRICS}
    stats.update({c: 0 for c in _COUNTERS})
    stats["max_split_size"] = -1
    return stats


def _accumulated(key):
    return key in _COUNTERS or key.endswith((".allocated", ".freed"))


def memory_stats(device=0):
    """torch.cuda.memory_stats()'s flat dict for xseg's allocator of
    `device`, with PyTorch's keys (zeros for a device xseg has not served:
    reading stats creates no allocator)."""
    lib = library()
    lib.valid_device(device)
    stats = lib.json("stats", device) if lib.lib.xseg_torch_has_allocator(
        device) else _zero_stats()
    for name in _UNTRACKED:
        for m in _STAT_METRICS:
            stats.setdefault("%s.%s" % (name, m), 0)
    for key, value in _accumulated_base.get(device, {}).items():
        stats[key] -= value
    return stats


def _nested(flat):
    """The nested dict torch._C._cuda_memoryStats returns, whose keys
    torch.cuda.memory_stats joins with '.'."""
    nested = {}
    for key, value in flat.items():
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


def reset_peak_memory_stats(device=0):
    """Every peak becomes the current value (torch.cuda's)."""
    lib = library()
    lib.valid_device(device)
    if lib.lib.xseg_torch_has_allocator(device):
        lib.call("reset_peak_stats", device)


def reset_accumulated_memory_stats(device=0):
    """The "allocated"/"freed" values and the counters start again from 0
    (torch.cuda's); xseg's own counters are kept, this module subtracts."""
    _accumulated_base.pop(device, None)
    stats = memory_stats(device)
    _accumulated_base[device] = {k: v for k, v in stats.items()
                                 if _accumulated(k)}


# ---- snapshots ----------------------------------------------------------------

_READABLE = 1 << 61
_MASK64 = (1 << 64) - 1


def _pool_id(first, second, device):
    """alloc/torch_pools.c's pool_id_of: the core's id of a MempoolId_t of
    `device`; for a pair PyTorch does not make, the id its pool got, while
    it lives (0: none)."""
    if second == 0 and 0 < first < _READABLE:
        return first << 1 | 1
    if first == 0 and 0 < second < _READABLE:
        return second << 1
    return library().lib.xseg_torch_pool_id(device, first & _MASK64,
                                            second & _MASK64)


def _pool_pair(core_id):
    """The MempoolId_t a segment's pool id (the core's) stands for: (0, 0)
    for none; PyTorch's pair back for a pool it named; the core's own id
    as (0, id) for the rest (a pool of another pair, numbered in turn; a
    capture xseg detected itself)."""
    if core_id == 0 or core_id >> 62:
        return (0, core_id)
    return (core_id >> 1, 0) if core_id & 1 else (0, core_id >> 1)


def memory_snapshot(pool=None, include_traces=True):
    """torch.cuda.memory._snapshot()'s dict over every device in use:
    {"segments": [...], "device_traces": [[...] per device]}; with `pool` (a
    MempoolId_t pair) the segments of that private pool alone."""
    lib = library()
    devices = lib.devices()
    snap = {"segments": [], "device_traces": []}
    # A list per device, as PyTorch's snapshot() has one per allocator it
    # made at init, used or not.
    for dev in range(max(max(devices, default=0) + 1, lib.device_count())):
        part = lib.json("snapshot", dev) if dev in devices else \
            {"segments": [], "device_traces": [[]]}
        for seg in part["segments"]:
            core_id = seg["segment_pool_id"][1]
            seg["segment_pool_id"] = _pool_pair(core_id)
            if pool is None or tuple(pool) == (0, 0) or \
                    core_id == _pool_id(pool[0], pool[1], dev):
                snap["segments"].append(seg)
        traces = part["device_traces"][0] if include_traces else []
        snap["device_traces"].append(traces)
    return snap


def record_memory_history(max_entries, devices=None):
    """Keeps the last max_entries allocator events (0: stop and forget) of
    `devices` for the snapshot's device_traces: by default every device,
    those first used later included (as torch's recordHistory). Changing
    the length keeps the newest events that fit."""
    lib = library()
    entries = max(0, min(int(max_entries), MAX_TRACE_ENTRIES))
    if devices is None:
        lib.clear_error()
        lib.lib.xseg_torch_record_memory_history(entries)
        if lib.last_error():
            raise _error(lib.last_error())
        return
    for dev in devices:
        lib.call("record_memory_history", dev, entries)


def empty_cache():
    """Waits for the work that guards free memory, then releases every whole
    free granule of every device (as torch.cuda.empty_cache() does once
    install()ed: xseg_torch_empty_cache_device, which releases what is safe
    during a capture xseg knows of, and refuses while a graph's pool is
    begun and has not allocated yet)."""
    lib = library()
    for dev in lib.devices():
        lib.check(lib.lib.xseg_torch_empty_cache_device(dev, 1),
                  "xseg_torch_empty_cache_device", dev)


def forget_stream(stream, device=None):
    """Before the CUDA stream behind `stream` (a torch.cuda.Stream or
    ExternalStream, or a raw cudaStream_t as an int) is destroyed: xseg
    waits for the work that guards the free memory cached for that stream,
    gives it back (other streams keep theirs) and asks the stream nothing
    more (xseg_forget_stream; a real
    driver may crash on a destroyed stream's handle). On the stream's
    device (`device`, else the stream's own, else every device xseg has
    used). PyTorch's own streams are never destroyed and need none of
    this. Raises XsegError while blocks allocated on the stream, or
    recorded on it (Tensor.record_stream), are alive."""
    lib = library()
    handle = getattr(stream, "cuda_stream", stream)
    if device is None:
        device = getattr(stream, "device_index", None)
    for dev in lib.devices():
        if device is None or dev == device:
            lib.call("forget_stream", dev, ctypes.c_void_p(handle))


def check():
    """Walks every structure of every device's allocator; raises XsegError
    naming the first broken invariant."""
    lib = library()
    for dev in lib.devices():
        if lib.lib.xseg_check(lib.lib.xseg_torch_allocator(dev)) != 0:
            raise XsegError("device %d: %s" %
                            (dev, lib.lib.xseg_last_error().decode()))


def raise_if_failed():
    """Raises the calling thread's last failure of a direct xseg_torch_* call
    (Library.malloc etc.; OutOfMemoryError for an allocation that could not
    be served), then forgets it. Not needed after install(): the hooks
    PyTorch calls raise at the failing call."""
    lib = library()
    message = lib.last_error()
    if message:
        lib.clear_error()
        raise _error(message)


# ---- install --------------------------------------------------------------------

def _version_tuple(version):
    m = re.match(r"(\d+)\.(\d+)", str(version))
    if not m:
        raise RuntimeError("xseg_torch: cannot read torch version %r" %
                           (version,))
    return int(m.group(1)), int(m.group(2))


def check_torch_version(torch):
    """Raises RuntimeError unless torch.__version__ is in SUPPORTED_TORCH."""
    found = _version_tuple(torch.__version__)
    (lo, hi) = SUPPORTED_TORCH
    if not lo <= found < hi:
        raise RuntimeError(
            "xseg_torch supports PyTorch %d.%d up to (not including) %d.%d; "
            "this is torch %s (%s)" % (lo + hi + (
                torch.__version__, getattr(torch, "__file__", "?"))))


_HOOKS = (  # _CUDAPluggableAllocator's setter, libxseg_torch.so's function
    ("set_record_stream_fn", "xseg_torch_cxx_record_stream"),
    ("set_reset_fn", "xseg_torch_cxx_empty_cache"),
    ("set_memory_fraction_fn", "xseg_torch_cxx_set_memory_fraction"),
    ("set_init_fn", "xseg_torch_cxx_init"),
    ("set_begin_allocate_to_pool", "xseg_torch_cxx_begin_allocate_to_pool"),
    ("set_end_allocate_to_pool_fn", "xseg_torch_cxx_end_allocate_to_pool"),
    ("set_release_pool", "xseg_torch_cxx_release_pool"),
)


def _address(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def _torch_memory_api(torch):
    """Replacements for torch._C's functions beneath torch.cuda's memory API
    (torch/cuda/memory.py calls each through the torch._C module at call
    time, so that every public function answers alike)."""

    def memory_stats_nested(device):
        return _nested(memory_stats(int(device)))

    def snapshot(*args):
        # _cuda_memorySnapshot(None) from _snapshot, (a, b, include_traces)
        # from memory_snapshot (2.8 on), a MempoolId_t or nothing before.
        pool, include_traces = None, True
        arg = args[0] if args else None
        if isinstance(arg, (tuple, list)):
            pool = tuple(arg[:2])
            if len(arg) > 2:
                include_traces = bool(arg[2])
        return memory_snapshot(pool, include_traces)

    def record_history(enabled, context=None, stacks="all",
                       max_entries=sys.maxsize, *rest):
        # torch/csrc/cuda/memory_snapshot.cpp: "state" keeps one entry,
        # "all" max_entries, None stops (and forgets); clear_history, the
        # fifth argument from 2.5 on, forgets what was kept first.
        entries = 0 if not enabled else \
            (max_entries if enabled == "all" else 1)
        if rest and rest[0]:
            record_memory_history(0)
        record_memory_history(entries)

    def record_history_legacy(enabled, record_context=True,
                              trace_alloc_max_entries=1, *rest):
        # (trace_alloc_record_context, record_context_cpp, clear_history...)
        if len(rest) > 2 and rest[2]:
            record_memory_history(0)
        record_memory_history(trace_alloc_max_entries if enabled else 0)

    api = {
        "_cuda_memoryStats": memory_stats_nested,
        "_cuda_resetPeakMemoryStats":
            lambda device: reset_peak_memory_stats(int(device)),
        "_cuda_resetAccumulatedMemoryStats":
            lambda device: reset_accumulated_memory_stats(int(device)),
        "_cuda_memorySnapshot": snapshot,
        "_cuda_record_memory_history": record_history,
        "_cuda_record_memory_history_legacy": record_history_legacy,
    }
    # torch.accelerator's memory functions (2.8 on) for the CUDA device.
    if hasattr(torch._C, "_accelerator_getDeviceStats"):
        api.update({
            "_accelerator_getDeviceStats": memory_stats_nested,
            "_accelerator_resetPeakStats":
                lambda device: reset_peak_memory_stats(int(device)),
            "_accelerator_resetAccumulatedStats":
                lambda device: reset_accumulated_memory_stats(int(device)),
        })
    return api


class _Installed:
    """What install() made: kept so that nothing it handed torch is freed."""

    def __init__(self, allocator, adapter, thrower, patched):
        self.allocator = allocator
        self.adapter = adapter
        self.thrower = thrower
        self.patched = patched


_installed = None


def installed():
    """The _Installed record of install(), or None."""
    return _installed


def install(path=None, patch_memory_api=True, adapter_path=None):
    """Makes xseg PyTorch's CUDA allocator; call before any CUDA tensor.
    Returns the torch.cuda.memory.CUDAPluggableAllocator."""
    global _installed
    import torch
    if _installed is not None:
        # Once installed, xseg stays: a later call may add the memory API,
        # and refuses other libraries than the ones loaded.
        asked = [(what, os.path.realpath(p), os.path.realpath(had))
                 for what, p, had in (("path", path, library().path),
                                      ("adapter_path", adapter_path,
                                       _installed.adapter._name))
                 if p is not None]
        for what, want, had in asked:
            if want != had:
                raise RuntimeError("xseg_torch.install(%s=%r): xseg is "
                                   "installed already from %s" %
                                   (what, want, had))
        if patch_memory_api and not _installed.patched:
            _patch_memory_api(torch, _installed.patched)
        return _installed.allocator
    check_torch_version(torch)
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "xseg_torch.install() must run before CUDA is initialised "
            "(before the first CUDA tensor): PyTorch cannot change the "
            "allocator of an initialised device")
    lib = library(path)
    adapter_path = adapter_path or _find("XSEG_TORCH_LIBRARY",
                                         "libxseg_torch.so.0")
    adapter = ctypes.CDLL(adapter_path)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        adapter_path, "xseg_torch_cxx_malloc", "xseg_torch_cxx_free")
    hooks = allocator.allocator()
    missing = [setter for setter, _ in _HOOKS if not hasattr(hooks, setter)]
    if missing:
        raise RuntimeError("xseg_torch: torch %s's _CUDAPluggableAllocator "
                           "lacks %s" % (torch.__version__,
                                         ", ".join(missing)))
    for setter, fn in _HOOKS:
        getattr(hooks, setter)(_address(adapter, fn))
    thrower = xseg_torch_oom.thrower(torch)
    adapter.xseg_torch_cxx_set_oom_thrower.argtypes = [ctypes.c_void_p]
    adapter.xseg_torch_cxx_set_oom_thrower(thrower)
    # What may fail comes before the swap, which cannot be undone (torch
    # refuses to swap an allocator that was initialised).
    import xseg_multiprocessing          # CUDA tensors through xseg's IPC
    api = _torch_memory_api(torch) if patch_memory_api else {}
    torch.cuda.memory.change_current_allocator(allocator)
    _installed = _Installed(allocator, adapter, thrower, {})
    xseg_multiprocessing.install(lib)
    _patch_memory_api(torch, _installed.patched, api)
    del lib
    return allocator


def _patch_memory_api(torch, patched, api=None):
    """Puts xseg's memory API on torch._C, keeping what it replaces in
    `patched`."""
    for name, fn in (api if api is not None
                     else _torch_memory_api(torch)).items():
        patched[name] = getattr(torch._C, name, None)
        setattr(torch._C, name, fn)
