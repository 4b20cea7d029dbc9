"""Tensors over storages, as c10 has them: a storage is a data pointer, a
size in bytes and a deleter run when the last reference goes; a tensor is
a storage with dtype, sizes, strides and an offset in elements."""
import ctypes
import os
import weakref


class dtype:
    def __init__(self, name, itemsize):
        self.name, self.itemsize = name, itemsize

    def __repr__(self):
        return "torch." + self.name


uint8, int16, int32, int64 = (dtype("uint8", 1), dtype("int16", 2),
                              dtype("int32", 4), dtype("int64", 8))
float16, bfloat16, float32, float64 = (dtype("float16", 2),
                                       dtype("bfloat16", 2),
                                       dtype("float32", 4),
                                       dtype("float64", 8))


class layout:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "torch." + self.name


strided, sparse_coo, sparse_csr, sparse_csc, sparse_bsr, sparse_bsc = (
    layout(name) for name in ("strided", "sparse_coo", "sparse_csr",
                              "sparse_csc", "sparse_bsr", "sparse_bsc"))


class device:
    def __init__(self, spec, index=None):
        if isinstance(spec, device):
            spec, index = spec.type, spec.index
        elif ":" in spec:
            spec, index = spec.split(":")[0], int(spec.split(":")[1])
        self.type = spec
        self.index = (0 if index is None else index) if spec == "cuda" \
            else index

    def __eq__(self, other):
        other = device(other) if isinstance(other, str) else other
        return (self.type, self.index) == (other.type, other.index)

    def __repr__(self):
        return "device(type=%r, index=%r)" % (self.type, self.index)


# StorageSharing.cpp's weak references: an int that names the StorageImpl
# without keeping its data alive.
_weak = {}
_weak_next = [1]


class UntypedStorage:
    def __init__(self, ptr, nbytes, dev, deleter=None):
        self._ptr, self._nbytes, self.device = ptr, nbytes, device(dev)
        self._deleter = deleter

    def data_ptr(self):
        return self._ptr

    def nbytes(self):
        return self._nbytes

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    def __del__(self):
        if self._deleter is not None:
            deleter, self._deleter = self._deleter, None
            deleter()

    def _weak_ref(self):
        cdata = _weak_next[0]
        _weak_next[0] += 1
        _weak[cdata] = weakref.ref(self)
        return cdata

    @classmethod
    def _new_with_weak_ptr(cls, cdata):
        ref = _weak.get(cdata)
        return ref() if ref is not None else None

    @staticmethod
    def _free_weak_ref(cdata):
        _weak.pop(cdata, None)

    @staticmethod
    def _expired(cdata):
        ref = _weak.get(cdata)
        return ref is None or ref() is None

    def _share_cuda_(self):
        # THPStorage_shareCuda -> CUDACachingAllocator::shareIpcHandle,
        # which CUDAPluggableAllocator refuses.
        raise RuntimeError("CUDAPluggableAllocator does not yet support "
                           "shareIPcHandle. If you need it, please file an "
                           "issue describing your use case.")


class Tensor:
    def __init__(self, storage, dt, size, stride, offset):
        self._storage, self.dtype = storage, dt
        self._size, self._stride, self._offset = tuple(size), tuple(stride), \
            offset
        self.requires_grad = False
        self.is_leaf = True
        self.is_nested = False
        self.layout = strided

    @property
    def device(self):
        return self._storage.device

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    def untyped_storage(self):
        return self._storage

    def storage_offset(self):
        return self._offset

    def size(self):
        return self._size

    def stride(self):
        return self._stride

    def data_ptr(self):
        return self._storage.data_ptr() + self._offset * self.dtype.itemsize

    def set_(self, source, storage_offset=0, size=(), stride=()):
        self._storage, self._offset = source, storage_offset
        self._size, self._stride = tuple(size), tuple(stride)
        return self

    def as_strided(self, size, stride, storage_offset=None):
        return Tensor(self._storage, self.dtype, size, stride,
                      self._offset if storage_offset is None
                      else storage_offset)

    def view(self, dt):
        """Tensor.view(dtype) of a contiguous 1-D tensor."""
        assert len(self._size) == 1 and self._stride == (1,)
        n = self._size[0] * self.dtype.itemsize // dt.itemsize
        return Tensor(self._storage, dt, (n,), (1,),
                      self._offset * self.dtype.itemsize // dt.itemsize)

    def detach(self):
        return Tensor(self._storage, self.dtype, self._size, self._stride,
                      self._offset)


def _contiguous_strides(size):
    strides, step = [], 1
    for n in reversed(size):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


class _Xseg:
    """The pluggable allocator once xseg is installed: xseg_torch_malloc and
    xseg_torch_free of libxseg.so ($XSEG_LIBRARY)."""
    lib = None

    @classmethod
    def get(cls):
        if cls.lib is None:
            lib = ctypes.CDLL(os.environ["XSEG_LIBRARY"])
            lib.xseg_torch_malloc.restype = ctypes.c_void_p
            lib.xseg_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int,
                                              ctypes.c_void_p]
            lib.xseg_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t,
                                            ctypes.c_int, ctypes.c_void_p]
            cls.lib = lib
        return cls.lib


def empty(size, dtype=float32, device="cuda"):
    from . import cuda
    size = (size,) if isinstance(size, int) else tuple(size)
    dev = globals()["device"](device)
    n = 1
    for s in size:
        n *= s
    nbytes = n * dtype.itemsize
    # CUDAPluggableAllocator::allocate asks the allocator for every size,
    # 0 bytes included (PyTorch's own caching allocator answers 0 with NULL
    # itself; a pluggable one is asked).
    stream = cuda.current_stream(dev.index).cuda_stream
    lib = _Xseg.get()
    ptr = lib.xseg_torch_malloc(nbytes, dev.index, stream)
    if not ptr:
        raise RuntimeError("CUDA out of memory (stand-in)")
    storage = UntypedStorage(
        ptr, nbytes, dev,
        lambda: lib.xseg_torch_free(ptr, nbytes, dev.index, stream))
    return Tensor(storage, dtype, size, _contiguous_strides(size), 0)
