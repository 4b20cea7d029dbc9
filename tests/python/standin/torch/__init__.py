"""A stand-in of the parts of torch that python/xseg_multiprocessing.py
touches, for tests without torch or a GPU, written from PyTorch's source:
tensors and untyped storages (c10::StorageImpl's data pointer, size and
deleter; the weak references of torch/csrc/StorageSharing.cpp), the CUDA
current stream (torch/cuda/streams.py), torch.utils.dlpack.from_dlpack
(aten/src/ATen/DLConvertor.cpp: the managed tensor's deleter runs when the
storage dies) and torch.multiprocessing.reductions (its reduce_tensor and
reduce_storage, and init_reductions' registrations, which importing torch
runs). CUDA tensors are allocated by libxseg.so's xseg_torch_malloc (what
the pluggable allocator calls once xseg is installed) on the emulator
($XSEG_TEST_SIM); torch's own CUDA sharing fails as it does for a
pluggable allocator. A change of these in PyTorch must be made here too.
"""
from ._tensor import (Tensor, UntypedStorage, device, dtype, empty,  # noqa
                      uint8, int16, int32, int64, float16, bfloat16, float32,
                      float64)
from . import cuda, nn, utils  # noqa: E402,F401

_tensor_classes = set()                 # torch's legacy typed tensor classes
_storage_classes = {UntypedStorage}

from . import multiprocessing  # noqa: E402,F401  (torch/__init__.py does)
