"""xseg as PyTorch's CUDA allocator, through ctypes (no build step).

    import xseg_torch
    xseg_torch.install()          # before the first CUDA allocation
    x = torch.empty(1 << 20, device="cuda")

install() hands libxseg.so's xseg_torch_malloc / xseg_torch_free to
torch.cuda.memory.CUDAPluggableAllocator and makes it the current allocator.
PyTorch cannot report statistics or snapshots of a pluggable allocator, so
this module does: memory_stats() (PyTorch's memory_stats() keys),
memory_snapshot() (the dict of torch.cuda.memory._snapshot(), which
torch.cuda._memory_viz and https://pytorch.org/memory_viz read),
empty_cache() and check().

An allocation xseg cannot serve returns NULL to PyTorch, which does not
check it; run allocating code under `with xseg_torch.oom_guard():` (or call
raise_if_failed() after it) to get torch.cuda.OutOfMemoryError with xseg's
message instead.

The library is found from XSEG_LIBRARY, else relative to this file (installed
as <prefix>/lib/xseg/python/xseg_torch.py, or python/ beside build/ in a
source tree), else by the dynamic loader (libxseg.so.0).
Configuration comes from XSEG_ALLOC_CONF, as for xseg_create.
"""

import contextlib
import ctypes
import json
import os

__all__ = ["Library", "OutOfMemoryError", "XsegError", "install", "library",
           "memory_stats", "memory_snapshot", "empty_cache", "check",
           "oom_guard", "raise_if_failed"]


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
    message ("tried to allocate X; device has Y total, Z free; ...")."""


def _candidates():
    env = os.environ.get("XSEG_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    # Installed as <prefix>/lib/xseg/python/xseg_torch.py; or in a source
    # tree beside build/.
    for rel in ("../../libxseg.so.0", "../build/libxseg.so.0"):
        path = os.path.normpath(os.path.join(here, rel))
        if os.path.exists(path):
            yield path
    yield "libxseg.so.0"


class Library:
    """libxseg.so's xseg_torch_* entry points, typed for ctypes."""

    def __init__(self, path=None):
        self.path = path or next(iter(_candidates()))
        self.lib = lib = ctypes.CDLL(self.path)
        vp, cp, i, d = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, \
            ctypes.c_double
        ull = ctypes.c_ulonglong
        self._sig("xseg_torch_malloc", vp, ctypes.c_ssize_t, i, vp)
        self._sig("xseg_torch_free", None, vp, ctypes.c_ssize_t, i, vp)
        self._sig("xseg_torch_record_stream", None, vp, vp)
        self._sig("xseg_torch_empty_cache", None)
        self._sig("xseg_torch_set_memory_fraction", None, d, i)
        self._sig("xseg_torch_begin_allocate_to_pool", None, i, ull, ull, vp)
        self._sig("xseg_torch_end_allocate_to_pool", None, i, ull, ull)
        self._sig("xseg_torch_release_pool", None, i, ull, ull)
        self._sig("xseg_torch_last_error", cp)
        self._sig("xseg_torch_clear_error", None)
        self._sig("xseg_torch_allocator", vp, i)
        self._sig("xseg_torch_has_allocator", i, i)
        self._sig("xseg_torch_device_limit", i)
        # Returned as void* (not c_char_p) so that they can be freed.
        self._sig("xseg_torch_stats_json", vp, i)
        self._sig("xseg_torch_snapshot_json", vp, i)
        self._sig("xseg_torch_string_free", None, vp)
        self._sig("xseg_check", i, vp)
        self._sig("xseg_last_error", cp)
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


def install(path=None):
    """Makes xseg PyTorch's CUDA allocator; call before any CUDA tensor.
    Returns the torch.cuda.memory.CUDAPluggableAllocator."""
    import torch
    lib = library(path)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        lib.path, "xseg_torch_malloc", "xseg_torch_free")
    torch.cuda.memory.change_current_allocator(allocator)
    import xseg_multiprocessing          # CUDA tensors through xseg's IPC
    xseg_multiprocessing.install(lib)
    return allocator


def memory_stats(device=0):
    """torch.cuda.memory_stats()'s dict, with its keys, for xseg's
    allocator of `device`."""
    return library().json("stats", device)


def memory_snapshot():
    """torch.cuda.memory._snapshot()'s dict over every device in use:
    {"segments": [...], "device_traces": [[...] per device]}."""
    lib = library()
    devices = lib.devices()
    snap = {"segments": [], "device_traces": []}
    for dev in range(max(devices, default=-1) + 1):
        part = lib.json("snapshot", dev) if dev in devices else \
            {"segments": [], "device_traces": [[]]}
        snap["segments"].extend(part["segments"])
        snap["device_traces"].append(part["device_traces"][0])
    return snap


def empty_cache():
    """Releases every whole free granule of every device (as
    torch.cuda.empty_cache(), which a pluggable allocator does not get)."""
    lib = library()
    lib.clear_error()
    lib.lib.xseg_torch_empty_cache()
    raise_if_failed()


def check():
    """Walks every structure of every device's allocator; raises XsegError
    naming the first broken invariant."""
    lib = library()
    for dev in lib.devices():
        if lib.lib.xseg_check(lib.lib.xseg_torch_allocator(dev)) != 0:
            raise XsegError("device %d: %s" %
                            (dev, lib.lib.xseg_last_error().decode()))


def raise_if_failed():
    """Raises the calling thread's last xseg failure (OutOfMemoryError for
    an allocation that could not be served), then forgets it."""
    lib = library()
    message = lib.last_error()
    if message:
        lib.clear_error()
        raise _error(message)


@contextlib.contextmanager
def oom_guard():
    """Within it, an allocation xseg could not serve raises
    OutOfMemoryError with xseg's message, whatever error PyTorch raised for
    the NULL pointer it got (or none)."""
    lib = library()
    lib.clear_error()
    try:
        yield
    except Exception as err:
        message = lib.last_error()
        if message:
            lib.clear_error()
            raise _error(message) from err
        raise
    raise_if_failed()
