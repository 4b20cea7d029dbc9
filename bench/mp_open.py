"""mp_open.py: what a torch.multiprocessing consumer pays to open and
close a CUDA tensor that xseg shares, on the emulator, without torch.

    bench/mp_open.py BUILD [N]

BUILD is a build folder configured with -DXSEG_BUILD_TESTS=ON (the
stand-in of torch, tests/python/standin, needs its C++ half). A producer
pickles N (default 200) tensors of 1 MiB with ForkingPickler, as an
mp.Queue does, and a consumer started with spawn unpickles each (the
open: the fd taken over, xseg_ipc_recv, xseg_ipc_open, the ticket given
back, xseg_ipc_wait, the storage made) and drops it (the close) before
the next, as tools/torch_check_mp.py's open_close_cost does with torch
on a GPU. Prints the medians in microseconds, the open's whole and the
C calls' parts. The emulator's driver is cheap: on a GPU the driver's
calls (import, map, set access, event open) add their own cost.
"""
import collections
import os
import statistics
import sys
import time

# The GPU check's own timing loop (tools/torch_check_mp.py), so that the
# two measure alike.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "tools"))
import torch_check_mp  # noqa: E402

MiB = 1 << 20


def _env(build):
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    return {
        "XSEG_LIBRARY": os.path.join(build, "libxseg.so.0"),
        "XSEG_TEST_SIM": os.path.join(build, "sim", "libcuda.so.1"),
        "XSEG_TEST_STANDIN": os.path.join(build, "tests",
                                          "libxseg_test_standin.so"),
        "XSEG_ALLOC_CONF": "xseg_driver:sim",
        "PYTHONPATH": os.pathsep.join([
            os.path.join(root, "python"),
            os.path.join(root, "tests", "python", "standin")]),
    }


PARTS = ("xseg_ipc_recv", "xseg_ipc_open", "xseg_ipc_ticket_give",
         "xseg_ipc_wait", "xseg_ipc_close")


def _consumer(conn, n):
    import xseg_multiprocessing
    import torch
    xseg_multiprocessing.install(os.environ["XSEG_LIBRARY"])
    lib = xseg_multiprocessing._lib
    took = collections.defaultdict(list)

    def timed(name, fn):
        def call(*args):
            t0 = time.perf_counter()
            r = fn(*args)
            took[name].append(time.perf_counter() - t0)
            return r
        return call

    for name in PARTS:
        setattr(lib.c, name, timed(name, getattr(lib.c, name)))
    torch.empty(16, dtype=torch.uint8)            # the allocator made
    opens, closes = torch_check_mp.time_opens(conn, n)
    us = lambda v: round(statistics.median(v) * 1e6, 1)  # noqa: E731
    conn.send({"open": us(opens), "close": us(closes),
               **{k: us(v) for k, v in took.items()}})


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    build = os.path.abspath(argv[1])
    n = int(argv[2]) if len(argv) > 2 else 200
    if "XSEG_LIBRARY" not in os.environ:          # again, with the setting
        env = dict(os.environ, **_env(build))
        os.execve(sys.executable, [sys.executable] + argv, env)
    import multiprocessing
    from multiprocessing.reduction import ForkingPickler
    import torch
    import xseg_multiprocessing
    xseg_multiprocessing.install(os.environ["XSEG_LIBRARY"])
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    p = ctx.Process(target=_consumer, args=(theirs, n))
    p.start()
    tensors = [torch.empty(MiB // 4, dtype=torch.float32) for _ in range(n)]
    for t in tensors:
        ours.send_bytes(bytes(ForkingPickler.dumps(t)))
    r = ours.recv()
    p.join()
    print("mp_open: %d tensors of 1 MiB, median us: open %.1f (%s), "
          "close %.1f (xseg_ipc_close %.1f)" % (
              n, r["open"], ", ".join("%s %.1f" % (k, r[k])
                                      for k in PARTS[:-1]),
              r["close"], r["xseg_ipc_close"]))
    return 0 if p.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
