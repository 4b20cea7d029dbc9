"""A stand-in of the parts of torch that python/xseg_torch.py and
python/xseg_multiprocessing.py touch, for tests without torch or a GPU.
Written from PyTorch's source: the names, the call paths and the failures
of torch/cuda/memory.py, torch/cuda/graphs.py and torch._C's bindings
(torch/csrc/cuda/Module.cpp), with CUDAPluggableAllocator's C++ side in
pluggable.cc (loaded from $XSEG_TEST_STANDIN); tensors and untyped storages
(c10::StorageImpl's data pointer, size and deleter; the weak references of
torch/csrc/StorageSharing.cpp), the current stream (torch/cuda/streams.py),
torch.utils.dlpack.from_dlpack (aten/src/ATen/DLConvertor.cpp: the managed
tensor's deleter runs when the storage dies) and
torch.multiprocessing.reductions (reduce_tensor, reduce_storage and
init_reductions' registrations, which importing torch runs). Streams are
the emulator's CUstream handles, as ints. CUDA tensors are allocated by
libxseg.so's xseg_torch_malloc, what the pluggable allocator calls once
xseg is installed; torch's own CUDA sharing fails as it does for a
pluggable allocator. A change of these in PyTorch must be made here too,
and then the tests say whether xseg_torch still fits.
"""
import os

__version__ = os.environ.get("XSEG_STANDIN_TORCH_VERSION", "2.9.1+standin")

from . import _C  # noqa: E402
from ._tensor import (Tensor, UntypedStorage, device, dtype, empty,  # noqa
                      uint8, int16, int32, int64, float16, bfloat16, float32,
                      float64, layout, strided, sparse_coo, sparse_csr,
                      sparse_csc, sparse_bsr, sparse_bsc)
from . import cuda, nn, utils  # noqa: E402,F401

OutOfMemoryError = _C.OutOfMemoryError
_tensor_classes = set()                 # torch's legacy typed tensor classes
_storage_classes = {UntypedStorage}

from . import multiprocessing  # noqa: E402,F401  (torch/__init__.py does)
