"""torch._C's CUDA allocator bindings (torch/csrc/cuda/Module.cpp) over
pluggable.cc. As in PyTorch, a pluggable allocator's stats, snapshots and
history raise "CUDAPluggableAllocator does not yet support ..."."""
import ctypes
import os

_GLIBCXX_USE_CXX11_ABI = True
_cpp = ctypes.CDLL(os.environ["XSEG_TEST_STANDIN"])
_vp, _sz, _u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
_err_args = [ctypes.c_char_p, _sz]
_cpp.standin_custom_allocator.restype = _vp
_cpp.standin_custom_allocator.argtypes = [_u64, _u64]
_cpp.standin_set.argtypes = [_vp, ctypes.c_char_p, _u64]
_cpp.standin_malloc.argtypes = [_vp, _sz, ctypes.c_int, _vp,
                                ctypes.POINTER(_vp)] + _err_args
_cpp.standin_raw_delete.argtypes = [_vp, _vp] + _err_args
_cpp.standin_init.argtypes = [_vp, ctypes.c_int] + _err_args
_cpp.standin_empty_cache.argtypes = [_vp] + _err_args
_cpp.standin_set_memory_fraction.argtypes = [_vp, ctypes.c_double,
                                             ctypes.c_int] + _err_args
_cpp.standin_record_stream.argtypes = [_vp, _vp, _vp] + _err_args
_pool_t = ctypes.c_ulonglong * 2
_cpp.standin_capture_begin.argtypes = [_vp, ctypes.c_int, _vp,
                                       _pool_t] + _err_args
_cpp.standin_capture_end.argtypes = [_vp, ctypes.c_int, _vp, _pool_t,
                                     ctypes.POINTER(_vp)] + _err_args
_cpp.standin_graph_reset.argtypes = [_vp, ctypes.c_int, _vp,
                                     _pool_t] + _err_args


class OutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError (what c10::OutOfMemoryError becomes). The
    stand-in has no c10, so nothing raises it from C++ here."""


def _call(fn, *args):
    """HANDLE_TH_ERRORS: a C++ exception becomes RuntimeError(what())."""
    err = ctypes.create_string_buffer(2048)
    if fn(*args, err, len(err)) != 0:
        raise RuntimeError(err.value.decode())


class _cuda_CUDAAllocator:
    pass


class _CUDAPluggableAllocator(_cuda_CUDAAllocator):
    """Its setters take a function pointer as an int (pybind11 uint64_t)."""

    def __init__(self, handle):
        self._handle = handle
        self.hooks_set = {}

    def _set(self, setter, func_ptr):
        if not isinstance(func_ptr, int) or isinstance(func_ptr, bool):
            raise TypeError("%s(): incompatible function arguments: %r" %
                            (setter, func_ptr))
        _cpp.standin_set(self._handle, setter.encode(), func_ptr)
        self.hooks_set[setter] = func_ptr


def _setter(name):
    def set_fn(self, func_ptr):
        self._set(name, func_ptr)
    set_fn.__name__ = name
    return set_fn


# Module.cpp's setters, each a method taking one int.
for _name in ("set_init_fn", "set_reset_fn", "set_memory_fraction_fn",
              "set_base_alloc_fn", "set_record_stream_fn",
              "set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn",
              "set_release_pool"):
    setattr(_CUDAPluggableAllocator, _name, _setter(_name))


class _State:
    initialized = False
    current = None          # the pluggable allocator, once changed to it


def _cuda_customAllocator(malloc_ptr, free_ptr):
    return _CUDAPluggableAllocator(
        _cpp.standin_custom_allocator(malloc_ptr, free_ptr))


def _cuda_changeCurrentAllocator(allocator):
    if _State.initialized:
        raise RuntimeError("Can't swap an already initialized allocator")
    _State.current = allocator


def _cuda_getAllocator():
    return _State.current


def _cuda_init():
    """THCPModule_initExtension: the allocator's init(device count)."""
    if _State.initialized:
        return
    _State.initialized = True
    if _State.current is not None:
        _call(_cpp.standin_init, _State.current._handle, 1)


def _pluggable(what):
    if _State.current is None:
        raise RuntimeError("the stand-in has only a pluggable allocator")
    return _State.current._handle


def _unsupported(what):
    def fn(*args, **kwargs):
        _pluggable(what)
        raise RuntimeError(
            "CUDAPluggableAllocator does not yet support %s. If you need it, "
            "please file an issue describing your use case." % what)
    return fn


_cuda_memoryStats = _unsupported("getDeviceStats")
_cuda_resetAccumulatedMemoryStats = _unsupported("resetAccumulatedStats")
_cuda_resetPeakMemoryStats = _unsupported("resetPeakStats")
_cuda_memorySnapshot = _unsupported("snapshot")
_cuda_record_memory_history = _unsupported("recordHistory")
_cuda_record_memory_history_legacy = _unsupported("recordHistory")


def _cuda_emptyCache():
    _call(_cpp.standin_empty_cache, _pluggable("emptyCache"))


def _cuda_setMemoryFraction(fraction, device):
    _call(_cpp.standin_set_memory_fraction, _pluggable("setMemoryFraction"),
          fraction, device)


def _cuda_cudaCachingAllocator_raw_alloc(size, stream):
    out = ctypes.c_void_p()
    _call(_cpp.standin_malloc, _pluggable("raw_alloc"), size, 0, stream,
          ctypes.byref(out))
    return out.value


def _cuda_cudaCachingAllocator_raw_delete(ptr):
    _call(_cpp.standin_raw_delete, _pluggable("raw_delete"), ptr)


def _standin_record_stream(ptr, stream):
    """Tensor.record_stream: recordStream(storage's DataPtr, stream)."""
    _call(_cpp.standin_record_stream, _pluggable("recordStream"), ptr, stream)
