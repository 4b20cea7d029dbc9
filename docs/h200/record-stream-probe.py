import json, os, sys, time
import xseg_torch
xseg_torch.install()
import torch
lib = xseg_torch.library()
MiB = 1 << 20
dev = torch.device("cuda")


def state(ptr):
    try:
        return state_of(ptr)
    except Exception as err:
        return "?(%r)" % err


def state_of(ptr):
    snap = lib.json("snapshot", 0)
    segs = snap.get("segments", snap) if isinstance(snap, dict) else snap
    for s in segs:
        addr = s.get("address", 0)
        for b in s.get("blocks", []):
            if addr <= ptr < addr + b.get("size", 0):
                return b.get("state")
            addr += b.get("size", 0)
    return "not found"


def stats():
    s = lib.json("stats", 0)
    return {k: v for k, v in s.items()
            if "pending" in k or "wait" in k or "inactive" in k}


for sleep in (1 << 30, 1 << 31):
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    n = 16 * MiB // 4
    with torch.cuda.stream(producer):
        a = torch.full((n,), 1.0, device=dev)
    consumer.wait_stream(producer)
    with torch.cuda.stream(consumer):
        torch.cuda._sleep(sleep)
        b = a * 2
    a.record_stream(consumer)
    a_ptr = a.data_ptr()
    print("recorded: state", state(a_ptr), flush=True)
    t0 = time.perf_counter()
    del a
    t1 = time.perf_counter()
    print("after del: state", state(a_ptr), "consumer idle", consumer.query(),
          stats(), flush=True)
    with torch.cuda.stream(producer):
        c = torch.empty((n,), device=dev)
        t2 = time.perf_counter()
        idle = consumer.query()
        c.fill_(7.0)
    c_ptr = c.data_ptr()
    print("after c: consumer idle", idle, "a's state", state(a_ptr),
          stats(), flush=True)
    torch.cuda.synchronize()
    print("sleep", sleep, "a", hex(a_ptr), "c", hex(c_ptr), "overlap",
          c_ptr < a_ptr + 4 * n and a_ptr < c_ptr + 4 * n,
          "del %.2f ms, alloc %.2f ms" % ((t1 - t0) * 1e3, (t2 - t1) * 1e3),
          "b intact", bool((b == 2.0).all()), flush=True)
    del b, c
print("check", lib.lib.xseg_check(lib.allocator(0)))
