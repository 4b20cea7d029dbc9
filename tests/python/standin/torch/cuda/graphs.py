"""torch.cuda.CUDAGraph's capture_begin / capture_end / reset as
aten/src/ATen/cuda/CUDAGraph.cpp calls the allocator, over pluggable.cc."""
import ctypes
import itertools

from .. import _C

_handles = itertools.count(1)


def graph_pool_handle():
    """A pool id {0, n} that graphs may share."""
    return (0, next(_handles))


class CUDAGraph:
    def __init__(self):
        self._pool = None
        self._exec = None

    def capture_begin(self, stream, pool=None):
        self._stream = stream
        self._pool = _C._pool_t(*(pool or (0, 0)))
        _C._call(_C._cpp.standin_capture_begin, _C._pluggable("graph"), 0,
                 stream, self._pool)

    def capture_end(self):
        exec_ = ctypes.c_void_p()
        _C._call(_C._cpp.standin_capture_end, _C._pluggable("graph"), 0,
                 self._stream, self._pool, ctypes.byref(exec_))
        self._exec = exec_

    def pool(self):
        return (self._pool[0], self._pool[1])

    def replay(self, cu):
        # CUDAGraph::replay launches on the current stream
        # (at::cuda::getCurrentCUDAStream()), not on the capture's.
        from .streams import current_stream
        stream = current_stream().cuda_stream
        if cu.cuGraphLaunch(self._exec, ctypes.c_void_p(stream)) != 0:
            raise RuntimeError("cudaGraphLaunch failed")

    def reset(self):
        if self._exec is not None:
            _C._call(_C._cpp.standin_graph_reset, _C._pluggable("graph"), 0,
                     self._exec, self._pool)
            self._exec = None
