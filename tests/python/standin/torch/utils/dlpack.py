"""torch.utils.dlpack.from_dlpack of a "dltensor" capsule, as
aten/src/ATen/DLConvertor.cpp's fromDLPack: the capsule is renamed
"used_dltensor", the tensor's storage spans the managed tensor's data and
its deleter calls the managed tensor's deleter."""
import ctypes

from .._tensor import Tensor, UntypedStorage, device, uint8

_get = ctypes.pythonapi.PyCapsule_GetPointer
_get.restype, _get.argtypes = ctypes.c_void_p, [ctypes.py_object,
                                                ctypes.c_char_p]
_rename = ctypes.pythonapi.PyCapsule_SetName
_rename.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _DLTensorHead(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensorHead), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.CFUNCTYPE(None, ctypes.c_void_p))]


_used = b"used_dltensor"


def _delete(m, address):
    if m.deleter:
        m.deleter(address)


def from_dlpack(capsule):
    address = _get(capsule, b"dltensor")
    m = _Managed.from_address(address)
    t = m.dl_tensor
    if t.device_type != 2 or t.code != 1 or t.bits != 8 or t.ndim != 1:
        raise RuntimeError("stand-in from_dlpack: only 1-D uint8 CUDA "
                           "tensors")
    _rename(capsule, _used)
    n = t.shape[0]
    # DLConvertor.cpp: the deleter is read when the storage goes, and
    # called only if set: [src](void*) { if (src->deleter) src->deleter(src); }
    storage = UntypedStorage(t.data + t.byte_offset, n,
                             device("cuda", t.device_id),
                             lambda: _delete(m, address))
    return Tensor(storage, uint8, (n,), (1,), 0)
