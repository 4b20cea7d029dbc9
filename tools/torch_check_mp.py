#!/usr/bin/env python3
"""torch_check_mp.py: torch.multiprocessing with xseg, on a GPU with torch.

For tools/torch-check.py (tools/ on sys.path), in a worker process whose
allocator is set up (xseg_torch.install() before any CUDA tensor, for
xseg):

    import torch_check_mp
    results = torch_check_mp.checks(torch)   # {name: (ok, detail)}; xseg only
    cost = torch_check_mp.open_close_cost(torch)   # any allocator

or alone, both allocators side by side (each in its own process):

    PYTHONPATH=python python3 tools/torch_check_mp.py [--json FILE]

checks(): CUDA tensors through an mp.Queue between processes started with
spawn, with xseg installed in each:
  mp_dtypes_views       float32, float16, bfloat16, int64, uint8 and bool
                        tensors and views (slice, step, transpose, narrow,
                        view(dtype)) arrive with their values, dtypes,
                        shapes, strides and offsets, views of one storage on
                        one storage; a write queued behind a long kernel and
                        not synchronized is seen (the interprocess event);
                        the consumer's write is seen by the producer
  mp_producer_deletes_first
                        the producer deletes its tensor before the consumer
                        opened it and reuses memory: the consumer reads the
                        old values; the block is pending until it closes
  mp_consumer_killed    a consumer holding the tensor is SIGKILLed: its hold
                        is taken back (pending 0, counted as reclaimed)
  mp_relay              a consumer writes, sends the tensor on and drops it;
                        a third process sees that write and writes; the
                        producer sees both
open_close_cost(): a consumer receives n tensors of 1 MiB (separate
blocks) pickled by ForkingPickler, as mp.Queue does, and drops them: the
median microseconds of the producer's pickling ("share"), the consumer's
unpickling ("open": fds from xseg's fd courier, map, event wait; or
PyTorch's cudaIpcOpenMemHandle) and of dropping it ("close").
"""
import argparse
import gc
import json
import os
import pickle
import signal
import statistics
import subprocess
import sys
import time

TIMEOUT = 120
MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))


def _setup(use_xseg):
    """A child's allocator, as its parent's."""
    if use_xseg:
        import xseg_torch
        xseg_torch.install()
    import torch
    torch.cuda.init()
    return torch


def _use_xseg():
    try:
        import xseg_multiprocessing
        return xseg_multiprocessing.installed()
    except ImportError:
        return False


def _stats():
    import xseg_multiprocessing
    return xseg_multiprocessing.stats(0)


def _settle(torch):
    """A malloc: xseg settles pending frees and reaps dead holders there."""
    gc.collect()
    torch.empty(1, device="cuda")


def _get(box, tag):
    msg = box.get(timeout=TIMEOUT)
    if msg[0] != tag:
        raise AssertionError("expected %r from a consumer, got %r" %
                             (tag, msg))
    return msg


def _start(ctx, target, *args):
    p = ctx.Process(target=target, args=(_use_xseg(),) + args)
    p.start()
    return p


def _join(p):
    p.join(TIMEOUT)
    if p.exitcode != 0:
        raise AssertionError("a consumer exited with %r" % p.exitcode)


# ---- consumers --------------------------------------------------------------

def _views_consumer(use_xseg, inbox, outbox):
    torch = _setup(use_xseg)
    items = inbox.get(timeout=TIMEOUT)
    meta = {k: (str(v.dtype), tuple(v.size()), v.stride(),
                v.storage_offset(), v.cpu()) for k, v in items.items()}
    storages = {items[k].untyped_storage().data_ptr()
                for k in ("float32", "slice", "reinterpreted")}
    outbox.put(("received", meta, len(storages)))
    inbox.get(timeout=TIMEOUT)
    items["float32"].add_(1)
    torch.cuda.synchronize()
    outbox.put(("wrote",))
    inbox.get(timeout=TIMEOUT)
    del items
    gc.collect()
    outbox.put(("closed",))


def _holding_consumer(use_xseg, inbox, outbox, tensors):
    torch = _setup(use_xseg)
    inbox.get(timeout=TIMEOUT)                      # told to open it now
    t = tensors.get(timeout=TIMEOUT)
    outbox.put(("received", bool((t == 3).all().item())))
    inbox.get(timeout=TIMEOUT)
    del t
    gc.collect()
    torch.cuda.synchronize()
    outbox.put(("closed",))


def _relay_consumer(use_xseg, inbox, outbox, onward):
    torch = _setup(use_xseg)
    t = inbox.get(timeout=TIMEOUT)
    t.mul_(2)                                       # not synchronized
    onward.put(t)
    onward.close()
    onward.join_thread()
    del t
    gc.collect()
    torch.cuda.synchronize()
    outbox.put(("relayed",))
    inbox.get(timeout=TIMEOUT)                      # the third has it


def _third_consumer(use_xseg, onward, outbox, inbox):
    torch = _setup(use_xseg)
    t = onward.get(timeout=TIMEOUT)
    want = torch.arange(t.numel(), device="cuda", dtype=t.dtype) * 2
    outbox.put(("third", bool(torch.equal(t, want))))
    t.add_(1)
    torch.cuda.synchronize()
    outbox.put(("wrote",))
    inbox.get(timeout=TIMEOUT)
    del t
    gc.collect()
    torch.cuda.synchronize()
    outbox.put(("closed",))


def _bouncing_consumer(use_xseg, inbox, outbox):
    torch = _setup(use_xseg)
    t = inbox.get(timeout=TIMEOUT)
    t.add_(1)                            # queued; ordered by the event
    outbox.put(("back", t))
    del t
    inbox.get(timeout=TIMEOUT)
    outbox.put(("done",))


def time_opens(conn, n):
    """Seconds each of n tensors received on conn took to open (unpickle)
    and to close (drop), one at a time: (opens, closes). bench/mp_open.py
    times the same on the emulator."""
    opens, closes = [], []
    for _ in range(n):
        msg = conn.recv_bytes()
        t0 = time.perf_counter()
        t = pickle.loads(msg)
        t1 = time.perf_counter()
        del t
        t2 = time.perf_counter()
        opens.append(t1 - t0)
        closes.append(t2 - t1)
    return opens, closes


def _cost_consumer(use_xseg, conn, n):
    torch = _setup(use_xseg)
    opens, closes = time_opens(conn, n)
    torch.cuda.synchronize()
    conn.send((opens, closes))


# ---- the checks -------------------------------------------------------------

def check_dtypes_views(torch, ctx):
    dev = "cuda"
    n = 4096
    r = torch.arange(n, device=dev)
    m = torch.arange(64 * 48, dtype=torch.float32, device=dev).view(64, 48)
    items = {
        "float32": r.to(torch.float32),
        "float16": (r % 1000).to(torch.float16),
        "bfloat16": (r % 200).to(torch.bfloat16),
        "int64": r * 3,
        "uint8": (r % 251).to(torch.uint8),
        "bool": r % 3 == 0,
    }
    items.update(slice=items["float32"][100:300], step=items["int64"][::3],
                 transposed=m.t(), narrow=m[5:20, 7:30],
                 reinterpreted=items["float32"].view(torch.int32))
    torch.cuda.synchronize()
    late = torch.empty(MiB, device=dev)
    torch.cuda._sleep(200 * 1000 * 1000)            # ~0.1 s of GPU time
    late.fill_(7.0)                                 # behind it, unsynchronized
    items["late"] = late
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = _start(ctx, _views_consumer, inbox, outbox)
    inbox.put(items)
    _, meta, n_storages = _get(outbox, "received")
    for k, v in items.items():
        want = (str(v.dtype), tuple(v.size()), v.stride(), v.storage_offset())
        if meta[k][:4] != want:
            raise AssertionError("%s arrived as %r, sent as %r" %
                                 (k, meta[k][:4], want))
        if not torch.equal(meta[k][4], v.cpu()):
            raise AssertionError("%s arrived with other values" % k)
    if n_storages != 1:
        raise AssertionError("views of one storage arrived on %d storages" %
                             n_storages)
    inbox.put("write")
    _get(outbox, "wrote")
    if not torch.equal(items["float32"], r.to(torch.float32) + 1):
        raise AssertionError("the consumer's write is not seen")
    inbox.put("drop")
    _get(outbox, "closed")
    _join(p)
    return "%d tensors and views; the unsynchronized write after a long " \
           "kernel was seen" % len(items)


def check_producer_deletes_first(torch, ctx):
    nbytes = 8 * MiB
    inbox, outbox, tensors = ctx.Queue(), ctx.Queue(), ctx.Queue()
    p = _start(ctx, _holding_consumer, inbox, outbox, tensors)
    t = torch.full((nbytes // 4,), 3.0, device="cuda")
    tensors.put(t)
    tensors.close()
    tensors.join_thread()
    del t
    reuse = [torch.full((nbytes // 4,), 9.0, device="cuda") for _ in range(4)]
    _settle(torch)
    pending = _stats()["pending_free_bytes"]
    if pending < nbytes:
        raise AssertionError("the deleted tensor is not pending (%d bytes)" %
                             pending)
    inbox.put("go")
    _, intact = _get(outbox, "received")
    if not intact:
        raise AssertionError("the consumer read reused memory")
    inbox.put("drop")
    _get(outbox, "closed")
    _join(p)
    del reuse
    _settle(torch)
    left = _stats()["pending_free_bytes"]
    if left != 0:
        raise AssertionError("%d bytes still pending after the consumer "
                             "closed" % left)
    return "read intact after the producer's del and reuse; %d bytes " \
           "pending until the consumer closed" % pending


def check_consumer_killed(torch, ctx):
    inbox, outbox, tensors = ctx.Queue(), ctx.Queue(), ctx.Queue()
    p = _start(ctx, _holding_consumer, inbox, outbox, tensors)
    t = torch.full((MiB,), 3.0, device="cuda")
    tensors.put(t)
    inbox.put("go")
    _get(outbox, "received")
    reclaimed = _stats()["reclaimed"]
    del t
    _settle(torch)
    held = _stats()
    os.kill(p.pid, signal.SIGKILL)
    p.join(TIMEOUT)
    _settle(torch)
    s = _stats()
    if held["pending_free_bytes"] == 0 or s["pending_free_bytes"] != 0 or \
            s["open_by_others"] != 0 or s["reclaimed"] != reclaimed + 1:
        raise AssertionError("after SIGKILL: %r (before: %r)" % (s, held))
    return "pending %d bytes while held, 0 after SIGKILL; reclaimed" % \
        held["pending_free_bytes"]


def check_relay(torch, ctx):
    outbox, relay_in, onward = ctx.Queue(), ctx.Queue(), ctx.Queue()
    third_in, third_out = ctx.Queue(), ctx.Queue()
    relay = _start(ctx, _relay_consumer, relay_in, outbox, onward)
    third = _start(ctx, _third_consumer, onward, third_out, third_in)
    t = torch.arange(MiB, device="cuda", dtype=torch.float32)
    relay_in.put(t)
    _get(outbox, "relayed")
    _, saw = _get(third_out, "third")
    if not saw:
        raise AssertionError("the third process did not see the relay's "
                             "write")
    _get(third_out, "wrote")
    if not torch.equal(t, torch.arange(MiB, device="cuda",
                                       dtype=torch.float32) * 2 + 1):
        raise AssertionError("the producer does not see both writes")
    relay_in.put("bye")
    third_in.put("drop")
    _get(third_out, "closed")
    _join(relay)
    _join(third)
    return "relay wrote, sent on and dropped it; the third saw and wrote"


def check_back_home(torch, ctx):
    """A tensor sent back to its producer is the producer's own storage
    (same pointer, nothing opened), with the consumer's write seen."""
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = _start(ctx, _bouncing_consumer, inbox, outbox)
    t = torch.zeros(MiB, device="cuda", dtype=torch.float32)
    opened = _stats()["opened_blocks"]
    inbox.put(t[16:])
    _, back = _get(outbox, "back")
    if back.data_ptr() != t.data_ptr() + 64:
        raise AssertionError("came back at %#x, sent from %#x" %
                             (back.data_ptr(), t.data_ptr() + 64))
    if _stats()["opened_blocks"] != opened:
        raise AssertionError("the producer opened its own block")
    if not (torch.equal(back, torch.ones_like(back)) and
            int(t[:16].sum()) == 0):
        raise AssertionError("the consumer's write is not what came back")
    del back
    inbox.put("bye")
    _get(outbox, "done")
    _join(p)
    return "same pointer, nothing opened, the consumer's write seen"


CHECKS = (("mp_dtypes_views", check_dtypes_views),
          ("mp_producer_deletes_first", check_producer_deletes_first),
          ("mp_consumer_killed", check_consumer_killed),
          ("mp_relay", check_relay),
          ("mp_back_home", check_back_home))


def checks(torch):
    """Runs the cases with xseg installed in this process; {name: (ok,
    detail)}, a failure reported, not raised."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    results = {}
    for name, fn in CHECKS:
        try:
            results[name] = (True, fn(torch, ctx))
        except Exception as err:
            results[name] = (False, "%s: %s" % (type(err).__name__,
                                                str(err)[:300]))
    return results


def open_close_cost(torch, n=200, nbytes=MiB):
    """Median microseconds to share (pickle), open (unpickle) and close
    (drop) a CUDA tensor of `nbytes`, for this process's allocator."""
    import multiprocessing
    from multiprocessing.reduction import ForkingPickler
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    p = _start(ctx, _cost_consumer, theirs, n)
    tensors = [torch.full((nbytes // 4,), float(i), device="cuda")
               for i in range(n)]
    torch.cuda.synchronize()
    shares = []
    for t in tensors:
        t0 = time.perf_counter()
        msg = bytes(ForkingPickler.dumps(t))
        shares.append(time.perf_counter() - t0)
        ours.send_bytes(msg)
    opens, closes = ours.recv()
    _join(p)
    del tensors
    us = lambda v: round(statistics.median(v) * 1e6, 1)  # noqa: E731
    return {"share_us": us(shares), "open_us": us(opens),
            "close_us": us(closes), "n": n, "bytes": nbytes}


# ---- alone: each allocator in a worker of its own ---------------------------

def _worker(allocator):
    torch = _setup(allocator == "xseg")
    out = {"cost": open_close_cost(torch)}
    if allocator == "xseg":
        out["checks"] = checks(torch)
    print("RESULT " + json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.worker:
        return _worker(args.worker)
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(HERE, "..", "python"), HERE] +
        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    results, ok = {}, True
    for allocator in ("native", "xseg"):
        done = subprocess.run([sys.executable, os.path.abspath(__file__),
                               "--worker", allocator], env=env, text=True,
                              capture_output=True, timeout=20 * TIMEOUT)
        lines = [x for x in done.stdout.splitlines()
                 if x.startswith("RESULT ")]
        if not lines:
            print("%s: exit %d: %s" % (allocator, done.returncode,
                                       (done.stderr or done.stdout)[-1500:]))
            ok = False
            continue
        results[allocator] = json.loads(lines[-1][len("RESULT "):])
    for name, (passed, detail) in sorted(
            results.get("xseg", {}).get("checks", {}).items()):
        ok &= passed
        print("%-26s %s  %s" % (name, "ok  " if passed else "FAIL", detail))
    print("%-8s %10s %10s %10s   (median us per 1 MiB tensor)" %
          ("", "share", "open", "close"))
    for allocator, r in results.items():
        c = r["cost"]
        print("%-8s %10.1f %10.1f %10.1f" % (allocator, c["share_us"],
                                             c["open_us"], c["close_us"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if ok and len(results) == 2 else 1


if __name__ == "__main__":
    sys.exit(main())
