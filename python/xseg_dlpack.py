"""A CUDA storage over device memory that torch frees through a callback.

torch.utils.dlpack.from_dlpack wraps a DLPack managed tensor (dlpack.h) as
a tensor whose storage calls the managed tensor's deleter once torch frees
it. xseg_multiprocessing gives torch a block received from another process
this way, the block's close as the deleter's work.
"""

import atexit
import ctypes
import threading

__all__ = ["cuda_storage"]

_CUDA = 2                     # DLPack's kDLCUDA


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice),
                ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLDeleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor),
                             ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DLDeleter)]

_lock = threading.Lock()
_managed = {}          # address of a managed tensor -> (it, shape, on_free)


def _dl_delete(managed):
    entry = _managed.pop(ctypes.addressof(managed.contents), None)
    if entry is not None:
        entry[2]()


_dl_deleter = _DLDeleter(_dl_delete)
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def cuda_storage(ptr, nbytes, device, on_free):
    """An untyped CUDA storage of `nbytes` bytes at `ptr` on `device`;
    on_free() runs once torch frees it."""
    import torch.utils.dlpack
    shape = (ctypes.c_int64 * 1)(nbytes)
    m = _DLManagedTensor()
    m.dl_tensor.data = ptr
    m.dl_tensor.device = _DLDevice(_CUDA, device)
    m.dl_tensor.ndim = 1
    m.dl_tensor.dtype = _DLDataType(1, 8, 1)         # kDLUInt, 8 bits
    m.dl_tensor.shape = shape
    m.dl_tensor.strides = None
    m.dl_tensor.byte_offset = 0
    m.deleter = _dl_deleter
    with _lock:
        _managed[ctypes.addressof(m)] = (m, shape, on_free)
    capsule = _capsule_new(ctypes.addressof(m), b"dltensor", None)
    base = torch.utils.dlpack.from_dlpack(capsule)
    return base.untyped_storage()


@atexit.register
def _at_exit():
    # Storages still alive now are freed in the interpreter's last
    # collection, when this module's functions and the ctypes thunk of the
    # deleter may be gone: calling back into them then crashed the process.
    # The process unmaps everything as it exits, so their deleters go
    # (torch calls a managed tensor's deleter only when it is set), and
    # the managed structs, which torch reads then, are kept.
    with _lock:
        for managed, _, _ in _managed.values():
            managed.deleter = _DLDeleter()
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(_managed))
