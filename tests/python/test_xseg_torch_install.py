"""xseg_torch.install() against the stand-in of torch (standin/torch, with
CUDAPluggableAllocator's C++ side in standin/pluggable.cc) on the emulator:
every hook PyTorch exposes is wired and reached the way PyTorch reaches it;
torch.cuda's memory functions answer with xseg's numbers; an allocation
xseg cannot serve raises at the failing call; a CUDA graph's pool takes only
its capture's allocations and gives its memory back when released.

Environment (set by tests/CMakeLists.txt): XSEG_LIBRARY, XSEG_TORCH_LIBRARY,
XSEG_TEST_SIM (the emulator), XSEG_TEST_STANDIN (pluggable.cc built),
XSEG_ALLOC_CONF=xseg_driver:sim, PYTHONPATH=python/.
Run with "unpatched" or "late" as argument for the cases that need a fresh
process (install is once per process, as PyTorch's allocator swap is).
"""
import ctypes
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "standin"))
# The emulator, loaded first and globally: xseg_driver:sim and the stand-in
# then use this very copy, so that their streams are the test's.
cu = ctypes.CDLL(os.environ["XSEG_TEST_SIM"], mode=ctypes.RTLD_GLOBAL)

import torch  # noqa: E402  (the stand-in)
import xseg_torch  # noqa: E402
from expect import expect, finish  # noqa: E402

MiB = 1 << 20


def raises(fn, exc, part):
    try:
        fn()
    except exc as err:
        if part in str(err):
            return True
        print("  raised, without %r: %s" % (part, err))
        return False
    return False


def cu_call(name, *args):
    r = getattr(cu, name)(*args)
    if r != 0:
        sys.exit("%s failed: CUresult %d" % (name, r))


def cu_setup():
    cu_call("cuInit", 0)
    ctx = ctypes.c_void_p()
    cu_call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), 0)
    cu_call("cuCtxSetCurrent", ctx)
    cu.cuMemsetD8Async.argtypes = [ctypes.c_uint64, ctypes.c_ubyte,
                                   ctypes.c_size_t, ctypes.c_void_p]
    cu.cuMemcpyDtoHAsync_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64,
                                        ctypes.c_size_t, ctypes.c_void_p]
    cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64,
                                   ctypes.c_size_t]
    cu.cuGraphLaunch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    # Handles are pointers: without argtypes ctypes passes a Python int as
    # a C int, and a handle above 2^31 arrives cut (CUDA_ERROR_INVALID_HANDLE).
    cu.cuStreamSynchronize.argtypes = [ctypes.c_void_p]


def stream_new():
    s = ctypes.c_void_p()
    cu_call("cuStreamCreate", ctypes.byref(s), 1)   # CU_STREAM_NON_BLOCKING
    return s.value


HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Latch:
    """Holds a stream back: a host function that waits until open()."""

    def __init__(self, stream):
        self.event = threading.Event()
        self.fn = HOST_FN(lambda _: self.event.wait(30))
        cu.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, HOST_FN,
                                        ctypes.c_void_p]
        cu_call("cuLaunchHostFunc", ctypes.c_void_p(stream), self.fn, None)

    def open(self):
        self.event.set()


def bytes_of(ptr, n):
    buf = (ctypes.c_ubyte * n)()
    cu_call("cuMemcpyDtoH_v2", buf, ptr, n)
    return bytes(buf)


def install_quietly(**kwargs):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        allocator = xseg_torch.install(**kwargs)
    return allocator, [str(w.message) for w in seen]


def check_versions():
    real = torch.__version__
    for bad in ("2.2.1", "3.0.0", "1.13.1+cu117"):
        torch.__version__ = bad
        expect(raises(xseg_torch.install, RuntimeError, "this is torch " + bad),
               "torch %s is refused by name" % bad)
    torch.__version__ = real


def check_hooks(allocator, messages):
    adapter = ctypes.CDLL(os.environ["XSEG_TORCH_LIBRARY"])
    hooks = allocator.allocator()
    for setter, fn in xseg_torch._HOOKS:
        want = ctypes.cast(getattr(adapter, fn), ctypes.c_void_p).value
        expect(hooks.hooks_set.get(setter) == want,
               "%s got %s's address" % (setter, fn))
    expect(len(hooks.hooks_set) == len(xseg_torch._HOOKS),
           "every hook PyTorch exposes (but base_alloc) is set")
    expect(any("OutOfMemoryError" in m for m in messages),
           "without torch's headers install() says OOM is a RuntimeError")
    expect(torch._C._cuda_getAllocator() is hooks, "xseg is torch's allocator")


def check_stats_and_record_stream(s1, s2):
    expect(torch.cuda.memory_stats() == {}, "no stats before CUDA starts")
    torch.cuda._lazy_init()       # PyTorch's init(device count) hook
    expect(raises(lambda: xseg_torch.library().allocator(1), xseg_torch.XsegError,
                  "device 1 is not in [0, 1)"),
           "init's device count bounds the devices")
    p = torch.cuda.caching_allocator_alloc(3 * MiB, stream=s1)
    expect(torch.cuda.memory_allocated() == 3 * MiB,
           "memory_allocated is xseg's (%d)" % torch.cuda.memory_allocated())
    expect(torch.cuda.max_memory_allocated() == 3 * MiB, "max_memory_allocated")
    expect(torch.cuda.memory_reserved() >= 3 * MiB, "memory_reserved")
    expect(torch.cuda.max_memory_reserved() >= torch.cuda.memory_reserved(),
           "max_memory_reserved")
    expect("oversize_segments" in torch.cuda.memory_summary(),
           "memory_summary finds every key it reads")
    # record_stream: s2 reads p behind a latch; p is freed on s1 and s1
    # allocates and writes at once: s2 must still read p's bytes.
    cu_call("cuMemsetD8Async", p, 0x11, 3 * MiB, s1)
    cu_call("cuStreamSynchronize", s1)
    seen = (ctypes.c_ubyte * (3 * MiB))()
    latch = Latch(s2)
    cu_call("cuMemcpyDtoHAsync_v2", seen, p, 3 * MiB, s2)
    torch._C._standin_record_stream(p, s2)
    torch.cuda.caching_allocator_delete(p)
    q = torch.cuda.caching_allocator_alloc(3 * MiB, stream=s1)
    expect(q + 3 * MiB <= p or p + 3 * MiB <= q,
           "a block recorded on a busy stream is not handed out again")
    cu_call("cuMemsetD8Async", q, 0x22, 3 * MiB, s1)
    cu_call("cuStreamSynchronize", s1)
    latch.open()
    cu_call("cuStreamSynchronize", s2)
    expect(bytes(seen) == b"\x11" * (3 * MiB), "the consumer read p intact")
    torch.cuda.caching_allocator_delete(q)
    expect(torch.cuda.memory_allocated() == 0, "everything freed")
    expect(torch.cuda.max_memory_allocated() == 3 * MiB,
           "the peak: p was no longer allocated once freed (%d)" %
           torch.cuda.max_memory_allocated())
    torch.cuda.reset_peak_memory_stats()
    expect(torch.cuda.max_memory_allocated() == 0, "reset_peak_memory_stats")
    torch.cuda.reset_accumulated_memory_stats()
    stats = torch.cuda.memory_stats()
    expect(stats["allocated_bytes.all.allocated"] == 0 and
           stats["num_device_alloc"] == 0, "reset_accumulated_memory_stats")
    r = torch.cuda.caching_allocator_alloc(MiB, stream=s1)
    torch.cuda.caching_allocator_delete(r)
    stats = torch.cuda.memory_stats()
    expect(stats["allocated_bytes.all.allocated"] == MiB and
           stats["allocated_bytes.all.freed"] == MiB,
           "accumulated stats count from the reset")
    torch.cuda.empty_cache()      # PyTorch's reset hook
    expect(torch.cuda.memory_reserved() == 0,
           "empty_cache returned every granule (%d left)" %
           torch.cuda.memory_reserved())


def check_history_and_snapshot(s1):
    torch.cuda.memory._record_memory_history(max_entries=1000)
    p = torch.cuda.caching_allocator_alloc(2 * MiB, stream=s1)
    segments = torch.cuda.memory_snapshot()
    blocks = [b for seg in segments for b in seg["blocks"]]
    expect(any(b["address"] == p and b["state"] == "active_allocated"
               for b in blocks), "memory_snapshot shows the live block")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "snapshot.pickle")
        torch.cuda.memory._dump_snapshot(path)
        with open(path, "rb") as f:
            snap = pickle.load(f)
    # What torch.cuda._memory_viz reads (segments, segsum, trace).
    for seg in snap["segments"]:
        for key in ("address", "total_size", "stream", "allocated_size",
                    "segment_type", "blocks"):
            expect(key in seg, "a segment has %s" % key)
        for b in seg["blocks"]:
            for key in ("address", "size", "requested_size", "state",
                        "frames"):
                expect(key in b, "a block has %s" % key)
        expect(sum(b["size"] for b in seg["blocks"]) == seg["total_size"],
               "a segment's blocks tile it")
    trace = snap["device_traces"][0]
    expect(any(e["action"] == "alloc" and e["addr"] == p and
               e["size"] == 2 * MiB for e in trace),
           "the trace holds the alloc")
    torch.cuda.caching_allocator_delete(p)
    expect(raises(lambda: torch.cuda.caching_allocator_alloc(1 << 50,
                                                             stream=s1),
                  RuntimeError, "CUDA out of memory."),
           "1 PiB raises at the call")
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    oom = [e for e in trace if e["action"] == "oom"]
    expect(len(oom) == 1 and oom[0].get("device_free", 0) > 0 and
           oom[0]["size"] == 1 << 50,
           "an oom entry with the device's free memory, as PyTorch's: %s" %
           oom)
    # Recording again keeps what was kept (PyTorch clears only when it
    # stops or is asked to); "state" keeps one entry; clear_history
    # forgets first.
    held = len(trace)
    torch.cuda.memory._record_memory_history(max_entries=1000)
    expect(len(torch.cuda.memory._snapshot()["device_traces"][0]) == held,
           "recording again kept the %d entries" % held)
    torch.cuda.memory._record_memory_history(enabled="state")
    expect(len(torch.cuda.memory._snapshot()["device_traces"][0]) == 1,
           "\"state\" keeps one entry")
    torch.cuda.memory._record_memory_history(max_entries=1000,
                                             clear_history=True)
    expect(torch.cuda.memory._snapshot()["device_traces"] == [[]],
           "clear_history forgot them")
    torch.cuda.memory._record_memory_history(enabled=None)
    expect(torch.cuda.memory._snapshot()["device_traces"] == [[]],
           "recording stopped")


def check_oom_and_fraction(s1):
    try:
        torch.cuda.caching_allocator_alloc(1 << 50, stream=s1)
        expect(False, "1 PiB raised nothing")
    except RuntimeError as err:
        msg = str(err)
        expect(msg.startswith("CUDA out of memory. Tried to allocate 1024.00 "
                              "TiB"), "PyTorch's message first: %s" % msg)
        for part in ("is free", "allocated by xseg", "may map at most"):
            expect(part in msg, "xseg's diagnosis has %r" % part)
    p = torch.cuda.caching_allocator_alloc(MiB, stream=s1)   # goes on
    expect(p != 0, "the program goes on after an OOM")
    total = ctypes.c_size_t()
    cu.cuDeviceTotalMem_v2.argtypes = [ctypes.POINTER(ctypes.c_size_t),
                                       ctypes.c_int]
    cu_call("cuDeviceTotalMem_v2", ctypes.byref(total), 0)
    torch.cuda.set_per_process_memory_fraction(0.25)
    expect(raises(lambda: torch.cuda.caching_allocator_alloc(
        total.value // 2, stream=s1), RuntimeError, "memory fraction 0.25"),
        "set_per_process_memory_fraction caps xseg")
    expect(raises(lambda: torch.cuda.set_per_process_memory_fraction(1.5),
                  ValueError, "Allowed range"), "torch checks the range")
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.caching_allocator_delete(p)
    expect(torch.cuda.memory_stats()["num_ooms"] >= 3, "num_ooms counts")


def check_graph(s1, s2):
    g = torch.cuda.CUDAGraph()
    cached = torch.cuda.caching_allocator_alloc(3 * MiB, stream=s1)
    torch.cuda.caching_allocator_delete(cached)
    g.capture_begin(s1)
    x = torch.cuda.caching_allocator_alloc(3 * MiB, stream=s1)
    cu_call("cuMemsetD8Async", x, 0x5A, 3 * MiB, s1)
    y = torch.cuda.caching_allocator_alloc(3 * MiB, stream=s2)  # outside
    g.capture_end()
    expect(x != cached, "the capture did not get the cached block")
    pool = g.pool()
    in_pool = [seg for seg in torch.cuda.memory_snapshot(pool)]
    expect(any(b["address"] == x for seg in in_pool for b in seg["blocks"]),
           "the graph's block is in its pool's snapshot")
    expect(not any(b["address"] == y for seg in in_pool
                   for b in seg["blocks"]),
           "a stream outside the capture is not in the pool")
    torch.cuda.caching_allocator_delete(x)
    z = torch.cuda.caching_allocator_alloc(3 * MiB, stream=s1)
    expect(z != x, "the graph's freed block stays out of the cache")
    cu_call("cuMemsetD8Async", x, 0, 3 * MiB, s1)
    cu_call("cuStreamSynchronize", s1)
    current = torch.cuda.current_stream().cuda_stream   # the replay's
    g.replay(cu)
    cu_call("cuStreamSynchronize", current)
    expect(bytes_of(x + 3 * MiB - 16, 16) == b"\x5a" * 16,
           "replay writes the graph's block")
    # Replayed again, held back, then reset (`g.replay(); del g`): the
    # pool's memory is not unmapped under the queued replay, whose stream
    # no event of xseg's covers; empty_cache waits for the device.
    latch = Latch(current)
    g.replay(cu)
    before = torch.cuda.memory_reserved()
    g.reset()                 # releasePool
    threading.Timer(0.1, latch.open).start()
    torch.cuda.empty_cache()
    expect(cu.cuStreamQuery(ctypes.c_void_p(current)) == 0,
           "empty_cache waited for the replay on another stream")
    expect(torch.cuda.memory_reserved() <= before - 3 * MiB,
           "releasing the pool returned its memory (%d -> %d)" %
           (before, torch.cuda.memory_reserved()))
    torch.cuda.caching_allocator_delete(y)
    torch.cuda.caching_allocator_delete(z)
    torch.cuda.empty_cache()
    expect(torch.cuda.memory_reserved() == 0, "nothing left")


def main_patched():
    cu_setup()
    s1, s2 = stream_new(), stream_new()
    check_versions()
    allocator, messages = install_quietly()
    check_hooks(allocator, messages)
    expect(xseg_torch.install() is allocator, "install() twice is one install")
    check_stats_and_record_stream(s1, s2)
    check_history_and_snapshot(s1)
    check_oom_and_fraction(s1)
    check_graph(s1, s2)
    xseg_torch.check()


def main_unpatched():
    cu_setup()
    install_quietly(patch_memory_api=False)
    torch.cuda._lazy_init()
    expect(raises(torch.cuda.memory_stats, RuntimeError,
                  "does not yet support getDeviceStats"),
           "patch_memory_api=False leaves torch._C alone")
    p = torch.cuda.caching_allocator_alloc(MiB, stream=None)
    expect(xseg_torch.memory_stats(0)["allocated_bytes.all.current"] == MiB,
           "xseg_torch.memory_stats still answers")
    torch.cuda.caching_allocator_delete(p)
    # A later install() with the memory API adds it (it used to return at
    # once, its argument ignored); other libraries than those loaded are
    # refused, naming the ones installed.
    xseg_torch.install()
    expect(torch.cuda.memory_stats()["allocated_bytes.all.current"] == 0,
           "a second install() puts the memory API on")
    expect(raises(lambda: xseg_torch.install(path="/no/such/libxseg.so"),
                  RuntimeError, "installed already from"),
           "a second install() from another library is refused")


def main_late():
    cu_setup()
    torch.cuda._lazy_init()
    expect(raises(xseg_torch.install, RuntimeError,
                  "must run before CUDA is initialised"),
           "install() after CUDA started says why it cannot")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "all"
    if mode == "all":
        main_patched()
        for sub in ("unpatched", "late"):
            done = subprocess.run([sys.executable, __file__, sub])
            expect(done.returncode == 0, "the %s case passes" % sub)
    else:
        {"unpatched": main_unpatched, "late": main_late}[mode]()
    finish(mode)
