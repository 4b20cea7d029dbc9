"""The out-of-memory thrower of xseg_torch, built against the user's torch.

PyTorch raises torch.cuda.OutOfMemoryError from C++ (c10::OutOfMemoryError,
TORCH_CHECK_WITH(OutOfMemoryError, ...)); a pluggable allocator that fails
returns no pointer, and torch then raises a plain RuntimeError. So
xseg_torch.install() compiles xseg_torch_oom.cc (beside this file) against
the torch it runs with, once per torch version, C++ ABI and source, into a
cache folder, and gives libxseg_torch.so its thrower. Without a compiler or
torch's headers, out of memory raises RuntimeError, with a warning.
"""

import ctypes
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import warnings

__all__ = ["thrower"]


def thrower(torch):
    """The address of xseg_torch_throw_oom built against this torch (cached
    by torch version, C++ ABI and source), or None with a warning when it
    cannot be built (no C++ compiler, no torch headers)."""
    if os.environ.get("XSEG_TORCH_NO_COMPILE"):
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    source = os.path.join(here, "xseg_torch_oom.cc")
    torch_dir = os.path.dirname(torch.__file__)
    include = os.path.join(torch_dir, "include")
    cxx = shlex.split(os.environ.get("CXX") or "") or \
        [c for c in (shutil.which("c++") or shutil.which("g++"),) if c]
    why = None
    if not os.path.exists(source):
        why = "%s is missing" % source
    elif not cxx:
        why = "no C++ compiler (c++, g++ or $CXX)"
    elif not os.path.exists(os.path.join(include, "c10", "util",
                                         "Exception.h")):
        why = "torch's C++ headers are not installed (%s)" % include
    if why:
        warnings.warn("xseg_torch: %s: out of memory raises RuntimeError "
                      "('CUDA out of memory. ...') instead of "
                      "torch.cuda.OutOfMemoryError" % why)
        return None
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    with open(source, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    cache = os.environ.get("XSEG_TORCH_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "xseg")
    name = "xseg_torch_oom-%s-abi%d-%s.so" % (
        re.sub(r"[^0-9A-Za-z.]", "_", torch.__version__), abi, digest)
    path = os.path.join(cache, name)
    if not os.path.exists(path):
        lib_dir = os.path.join(torch_dir, "lib")
        tmp, cmd = None, cxx
        try:
            os.makedirs(cache, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
            os.close(fd)
            cmd = cxx + ["-shared", "-fPIC", "-O2", "-std=c++17",
                         "-D_GLIBCXX_USE_CXX11_ABI=%d" % abi, "-I" + include,
                         source, "-L" + lib_dir, "-lc10",
                         "-Wl,-rpath," + lib_dir, "-o", tmp]
            done = subprocess.run(cmd, capture_output=True, text=True)
            failure = done.stderr[-2000:] if done.returncode != 0 else None
            if failure is None:
                os.replace(tmp, path)
        except OSError as err:          # no compiler there, no cache folder
            failure = str(err)
        if failure is not None:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
            warnings.warn("xseg_torch: building %s failed (%s): out of "
                          "memory raises RuntimeError instead of "
                          "torch.cuda.OutOfMemoryError\n%s" % (
                              source, " ".join(cmd), failure))
            return None
    return ctypes.cast(ctypes.CDLL(path).xseg_torch_throw_oom,
                       ctypes.c_void_p).value
