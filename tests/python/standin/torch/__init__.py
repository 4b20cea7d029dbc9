"""A stand-in of the parts of torch that python/xseg_torch.py touches, for
tests without torch or a GPU. Written from PyTorch's source: the names, the
call paths and the failures of torch/cuda/memory.py, torch/cuda/graphs.py
and torch._C's bindings (torch/csrc/cuda/Module.cpp), with
CUDAPluggableAllocator's C++ side in pluggable.cc (loaded from
$XSEG_TEST_STANDIN). Streams are the emulator's CUstream handles, as ints.
A change of these in PyTorch must be made here too, and then the tests
say whether xseg_torch still fits.
"""
import os

__version__ = os.environ.get("XSEG_STANDIN_TORCH_VERSION", "2.9.1+standin")

from . import _C  # noqa: E402
from . import cuda  # noqa: E402

OutOfMemoryError = _C.OutOfMemoryError
