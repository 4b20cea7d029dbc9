"""python/xseg_torch.py on the emulator, without torch: allocates, frees,
records a stream, reads stats and a snapshot, and turns a failed allocation
into OutOfMemoryError with xseg's message (raise_if_failed).

Environment (set by tests/CMakeLists.txt): XSEG_LIBRARY (libxseg.so),
XSEG_TEST_SIM (the emulator, for the context and streams this program makes
itself), XSEG_ALLOC_CONF=xseg_driver:sim, PYTHONPATH=python/. Run directly,
`python3 tests/python/test_xseg_torch.py [BUILD_DIR]` takes what is unset
from a build tree (./build unless given).
"""
import ctypes
import os
import sys


def defaults_from_build_tree():
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                            os.path.join(root, "build"))
    found = {"XSEG_LIBRARY": os.path.join(build, "libxseg.so.0"),
             "XSEG_TEST_SIM": os.path.join(build, "sim", "libcuda.so.1")}
    for key, path in found.items():
        if key not in os.environ and not os.path.exists(path):
            sys.exit("test_xseg_torch.py: no %s (%s unset); build first "
                     "(cmake -S . -B build && cmake --build build) or name "
                     "the build folder: python3 %s BUILD_DIR" %
                     (path, key, sys.argv[0]))
        os.environ.setdefault(key, path)
    os.environ.setdefault("XSEG_ALLOC_CONF", "xseg_driver:sim")
    sys.path.insert(0, os.path.join(root, "python"))


defaults_from_build_tree()
import xseg_torch  # noqa: E402  (after the path above)
from expect import expect, finish  # noqa: E402

MiB = 1 << 20


# The emulator, loaded first and globally: xseg_driver:sim then uses this
# very copy, so that its streams are the allocator's streams.
cu = ctypes.CDLL(os.environ["XSEG_TEST_SIM"], mode=ctypes.RTLD_GLOBAL)


def cu_call(name, *args):
    r = getattr(cu, name)(*args)
    if r != 0:
        sys.exit("%s failed: CUresult %d" % (name, r))


cu_call("cuInit", 0)
ctx = ctypes.c_void_p()
cu_call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), 0)
cu_call("cuCtxSetCurrent", ctx)
s1, s2 = ctypes.c_void_p(), ctypes.c_void_p()
cu_call("cuStreamCreate", ctypes.byref(s1), 1)   # CU_STREAM_NON_BLOCKING
cu_call("cuStreamCreate", ctypes.byref(s2), 1)

lib = xseg_torch.library()
expect(lib.devices() == [], "no allocator before the first call")

p = lib.malloc(3 * MiB, 0, s1)
q = lib.malloc(1000, 0, s1)
expect(p and q and p % 512 == 0 and q % 512 == 0, "two aligned blocks")
expect(lib.devices() == [0], "device 0's allocator created on first use")
cu.cuMemsetD8Async.argtypes = [ctypes.c_uint64, ctypes.c_ubyte,
                               ctypes.c_size_t, ctypes.c_void_p]
cu_call("cuMemsetD8Async", p, 0xA5, 3 * MiB, s2)   # p is used on s2 too
lib.record_stream(p, s2)
expect(lib.last_error() == "", "record_stream of a live block succeeds")

stats = xseg_torch.memory_stats(0)
expect(stats["allocated_bytes.all.current"] == 3 * MiB + 1024,
       "allocated_bytes.all.current counts both blocks (%d)" %
       stats["allocated_bytes.all.current"])
expect("reserved_bytes.all.peak" in stats and "num_alloc_retries" in stats,
       "memory_stats has PyTorch's keys")

snap = xseg_torch.memory_snapshot()
blocks = [b for seg in snap["segments"] for b in seg["blocks"]]
live = {b["address"] for b in blocks if b["state"] == "active_allocated"}
expect({p, q} <= live, "snapshot shows both blocks allocated")
expect(len(snap["device_traces"]) == 1, "one device's traces")

# A graph pool's segments carry PyTorch's MempoolId_t, as
# torch.cuda.memory._snapshot() gives them (inductor's cudagraph trees find a
# graph's segments by graph.pool()): a graph's own pool (n, 0), and a
# graph_pool_handle() or MemPool one (0, n); memory_snapshot(pool) keeps
# that pool's alone.
pool_calls = {}
for name in ("begin_allocate_to_pool", "end_allocate_to_pool",
             "release_pool"):
    fn = getattr(lib.lib, "xseg_torch_" + name)
    fn.restype = None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong] + \
        ([ctypes.c_void_p] if name.startswith("begin") else [])
    pool_calls[name] = fn
for pool in ((5, 0), (0, 7)):
    pool_calls["begin_allocate_to_pool"](0, pool[0], pool[1], s1)
    b = lib.malloc(MiB, 0, s1)
    pool_calls["end_allocate_to_pool"](0, *pool)
    holding = [seg["segment_pool_id"]
               for seg in xseg_torch.memory_snapshot()["segments"]
               if any(blk["address"] == b for blk in seg["blocks"])]
    expect(holding == [pool], "the segment of a block of pool %r says %r" %
           (pool, holding))
    only = xseg_torch.memory_snapshot(pool)["segments"]
    expect(only and all(seg["segment_pool_id"] == pool for seg in only),
           "memory_snapshot(%r) keeps that pool's segments: %r" %
           (pool, [seg["segment_pool_id"] for seg in only]))
    lib.free(b, MiB, 0, s1)
    pool_calls["release_pool"](0, *pool)
expect(lib.last_error() == "", "the pools went without a failure: %s" %
       lib.last_error())

lib.free(p, 3 * MiB, 0, s1)
lib.free(q, 1000, 0, s1)
cu_call("cuStreamSynchronize", s2)
xseg_torch.check()
xseg_torch.empty_cache()
stats = xseg_torch.memory_stats(0)
expect(stats["allocated_bytes.all.current"] == 0, "everything freed")
expect(stats["reserved_bytes.all.current"] == 0,
       "empty_cache released every granule (%d left)" %
       stats["reserved_bytes.all.current"])

# A request beyond the device: NULL, the failure kept for the caller
# (libxseg_torch.so, which PyTorch calls, throws it instead).
big = lib.malloc(1 << 50, 0, s1)
expect(not big, "1 PiB is refused")
try:
    xseg_torch.raise_if_failed()
    expect(False, "raise_if_failed raised nothing")
except xseg_torch.OutOfMemoryError as err:
    expect("XSEG_ERR_OUT_OF_MEMORY" in str(err) and
           "Tried to allocate" in str(err), "xseg's message: %s" % err)
expect(lib.last_error() == "", "the error is forgotten once raised")

# Bad input is reported, not a crash: an unknown pointer, a bad device.
lib.record_stream(0x1000, s2)
try:
    xseg_torch.raise_if_failed()
    expect(False, "record_stream of an unknown pointer raised nothing")
except xseg_torch.XsegError as err:
    expect("XSEG_ERR_UNKNOWN_POINTER" in str(err), "names the cause: %s" % err)
expect(not lib.malloc(MiB, -1, s1) and "device -1" in lib.last_error(),
       "device -1 is refused by name")
lib.clear_error()
xseg_torch.check()

# A stream the program destroys is forgotten first: refused while a block
# allocated on it lives, done once it is freed.
r = lib.malloc(MiB, 0, s2)
try:
    xseg_torch.forget_stream(s2.value)
    expect(False, "forget_stream of a stream with a live block raised nothing")
except xseg_torch.XsegError as err:
    expect("blocks allocated on it are live" in str(err),
           "names the cause: %s" % err)
lib.free(r, MiB, 0, s2)
xseg_torch.forget_stream(s2.value)
xseg_torch.forget_stream(s1.value, device=0)
xseg_torch.check()

cu_call("cuStreamDestroy_v2", s1)
cu_call("cuStreamDestroy_v2", s2)

# xseg_driver:sim finds the emulator beside libxseg.so when the library was
# loaded by a relative path (XSEG_LIBRARY=build/libxseg.so.0, a relative
# LD_LIBRARY_PATH): the loader keeps the name relative, and it used to be
# taken for the program's (the emulator was looked for beside python3).
import subprocess  # noqa: E402
library = os.path.realpath(os.environ["XSEG_LIBRARY"])
parent = os.path.dirname(os.path.dirname(library))
probe = ("import ctypes, sys\n"
         "lib = ctypes.CDLL(sys.argv[1])\n"
         "lib.xseg_create.argtypes = [ctypes.c_int, ctypes.c_char_p,\n"
         "                            ctypes.POINTER(ctypes.c_void_p)]\n"
         "lib.xseg_last_error.restype = ctypes.c_char_p\n"
         "a = ctypes.c_void_p()\n"
         "st = lib.xseg_create(0, b'xseg_driver:sim', ctypes.byref(a))\n"
         "print(st, lib.xseg_last_error().decode())\n")
env = {k: v for k, v in os.environ.items()
       if k not in ("XSEG_SIM_LIBRARY", "LD_LIBRARY_PATH", "LD_PRELOAD")}
done = subprocess.run([sys.executable, "-c", probe,
                       os.path.relpath(library, parent)],
                      cwd=parent, env=env, capture_output=True, text=True)
expect(done.returncode == 0 and done.stdout.startswith("0 "),
       "the emulator is found beside a library loaded by a relative path: "
       "%r %r" % (done.stdout, done.stderr[-500:]))
# The OOM thrower that install() builds: a compiler that cannot be run
# ($CXX naming none, or a command with arguments that is not split) or a
# cache that cannot be made means a warning and None (out of memory then
# raises RuntimeError), not a failed install, and no file left behind.
import tempfile  # noqa: E402
import types  # noqa: E402
import xseg_torch_oom  # noqa: E402
import warnings  # noqa: E402
with tempfile.TemporaryDirectory() as tmp:
    torch_dir = os.path.join(tmp, "torch")
    os.makedirs(os.path.join(torch_dir, "include", "c10", "util"))
    open(os.path.join(torch_dir, "include", "c10", "util", "Exception.h"),
         "w").close()
    fake = types.SimpleNamespace(__file__=os.path.join(torch_dir,
                                                       "__init__.py"),
                                 __version__="2.5.0", _C=types.SimpleNamespace())
    cache = os.path.join(tmp, "cache")
    saved = {k: os.environ.get(k) for k in ("CXX", "XSEG_TORCH_CACHE",
                                            "XSEG_TORCH_NO_COMPILE")}
    os.environ.pop("XSEG_TORCH_NO_COMPILE", None)
    for cxx, where in (("no-such-compiler-xseg", cache),
                       ("no-such-compiler-xseg -m64", cache),
                       ("c++", "/proc/xseg-no-cache")):
        os.environ["CXX"], os.environ["XSEG_TORCH_CACHE"] = cxx, where
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                got = xseg_torch_oom.thrower(fake)
            except OSError as err:
                got = err
        expect(got is None and any("raises RuntimeError" in str(w.message)
                                   for w in caught),
               "CXX=%r, cache %s: a warning, not %r" % (cxx, where, got))
    expect(not os.path.exists(cache) or os.listdir(cache) == [],
           "nothing left in the cache: %r" %
           (os.listdir(cache) if os.path.exists(cache) else None))
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
# Once torch's init gave the device count: memory_snapshot() has a trace
# list per device, as PyTorch's (one per allocator made at init, used or
# not), and memory_stats of a device torch does not have raises, as its
# assertValidDevice. (Last: init's count stays for the process.)
lib = xseg_torch.library()
lib.lib.xseg_torch_init(3)
expect(len(xseg_torch.memory_snapshot()["device_traces"]) == 3,
       "a trace list per device: %d" %
       len(xseg_torch.memory_snapshot()["device_traces"]))
for bad in (3, -1):
    try:
        xseg_torch.memory_stats(bad)
        expect(False, "memory_stats(%d) of 3 devices answered" % bad)
    except RuntimeError as err:
        expect("Invalid device argument" in str(err), str(err))
expect(xseg_torch.memory_stats(2)["allocated_bytes.all.current"] == 0,
       "an unused device reads zeros")
finish("test_xseg_torch")
