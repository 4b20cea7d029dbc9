"""torch.cuda.Stream and current_stream over the emulator ($XSEG_TEST_SIM):
device 0's primary context is made current first, as torch's lazy
initialisation does; the current stream is one non-blocking stream per
process (torch's is per thread and device; the tests use one of each)."""
import ctypes
import os

_state = {}


def _cu():
    if "cu" not in _state:
        _state["cu"] = ctypes.CDLL(os.environ["XSEG_TEST_SIM"],
                                   mode=ctypes.RTLD_GLOBAL)
    return _state["cu"]


def _check(name, *args):
    r = getattr(_cu(), name)(*args)
    if r != 0:
        raise RuntimeError("CUDA error: %s returned %d" % (name, r))


def _context():
    """The primary context, current in the calling thread."""
    if "ctx" not in _state:
        _check("cuInit", 0)
        ctx = ctypes.c_void_p()
        _check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), 0)
        _state["ctx"] = ctx
    _check("cuCtxSetCurrent", _state["ctx"])


class Stream:
    def __init__(self, handle):
        self.cuda_stream = handle

    def synchronize(self):
        _context()
        _check("cuStreamSynchronize", ctypes.c_void_p(self.cuda_stream))

    def query(self):
        _context()
        r = _cu().cuStreamQuery(ctypes.c_void_p(self.cuda_stream))
        if r not in (0, 600):              # CUDA_ERROR_NOT_READY
            raise RuntimeError("CUDA error: cuStreamQuery returned %d" % r)
        return r == 0


def current_stream(device=None):
    _context()
    if "stream" not in _state:
        s = ctypes.c_void_p()
        _check("cuStreamCreate", ctypes.byref(s), 1)   # NON_BLOCKING
        _state["stream"] = Stream(s.value)
    return _state["stream"]
