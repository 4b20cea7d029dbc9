"""python/xseg_multiprocessing.py on the emulator, without torch: CUDA
tensors of a stand-in of torch (tests/python/standin) go through
multiprocessing queues between real processes started with the spawn
method, pickled by the reductions install() puts on ForkingPickler.

Cases: a round trip whose consumer first waits, on its stream, for work
the producer queued behind a held stream; several dtypes and views of one
storage (one open in the consumer); the producer deleting its tensor
before the consumer received it; a consumer killed by SIGKILL; a consumer
that sends the tensor on to a third process; a tensor sent back to its
producer (its own storage, nothing opened); a storage sent alone; an
empty tensor; a compressed sparse tensor, and a tensor that xseg did not
allocate, which keep torch's own reductions.
Each checks bytes, the producer's pending bytes and the holds on its
blocks.

Environment (set by tests/CMakeLists.txt): XSEG_LIBRARY (libxseg.so),
XSEG_TEST_SIM (the emulator), XSEG_ALLOC_CONF=xseg_driver:sim,
PYTHONPATH=python/ and tests/python/standin, XSEG_TEST_STANDIN (the
stand-in's C++ half, which its torch._C loads).
"""
import ctypes
import gc
import multiprocessing
import os
import signal
import sys

import torch
import xseg_multiprocessing
from expect import expect, failures

TIMEOUT = 60


# ---- helpers shared by every process ----------------------------------------

def cu():
    torch.cuda._lazy_init()
    return torch.cuda.streams._cu()


def cu_call(name, *args):
    r = getattr(cu(), name)(*args)
    if r != 0:
        raise RuntimeError("%s returned CUresult %d" % (name, r))


def stream():
    return torch.cuda.current_stream(0)


def fill(t, value, asynchronous=False):
    """Sets every byte of t's (contiguous) elements, on the current stream;
    waits for it unless asynchronous."""
    n = t.size()[0] * t.dtype.itemsize if t.size() else 0
    cu_call("cuMemsetD8Async", ctypes.c_uint64(t.data_ptr()),
            ctypes.c_ubyte(value), ctypes.c_size_t(n),
            ctypes.c_void_p(stream().cuda_stream))
    if not asynchronous:
        stream().synchronize()


def bytes_of(t, n=None):
    n = t.size()[0] * t.dtype.itemsize if n is None else n
    buf = (ctypes.c_ubyte * n)()
    stream().synchronize()
    cu_call("cuMemcpyDtoH_v2", buf, ctypes.c_uint64(t.data_ptr()),
            ctypes.c_size_t(n))
    return bytes(buf)


def stats():
    return xseg_multiprocessing.stats(0)


def settle():
    """A malloc and its free: xseg settles pending frees (and reaps dead
    holders) at a malloc."""
    gc.collect()
    t = torch.empty(128, dtype=torch.uint8)
    del t


def setup():
    xseg_multiprocessing.install(os.environ["XSEG_LIBRARY"])


_HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Latch:
    """Holds the current stream back: a host function that waits for a byte
    on a pipe (tests/harness's latch, in Python)."""

    def __init__(self):
        self.r, self.w = os.pipe()
        self.fn = _HOSTFN(lambda _: os.read(self.r, 1))
        cu_call("cuLaunchHostFunc", ctypes.c_void_p(stream().cuda_stream),
                self.fn, None)

    def open(self):
        os.write(self.w, b"x")


# ---- consumers (children started with spawn) --------------------------------

def round_trip_consumer(inbox, outbox):
    """Receives (t, views...), checks they wait for the producer's held
    work, then reads and writes back."""
    setup()
    t, strided, as_int = inbox.get(timeout=TIMEOUT)
    same = (t.untyped_storage() is strided.untyped_storage() is
            as_int.untyped_storage())
    meta = [(x.dtype.name, x.size(), x.stride(), x.storage_offset())
            for x in (t, strided, as_int)]
    s = stats()
    outbox.put(("received", same, meta, stream().query(),
                s["opened_blocks"], s["opened_total"]))
    inbox.get(timeout=TIMEOUT)                      # the producer let go
    outbox.put(("read", bytes_of(t, 16), bytes_of(as_int, 16)))
    fill(t, 0x22)
    outbox.put(("wrote",))
    inbox.get(timeout=TIMEOUT)
    del t, strided, as_int
    gc.collect()
    outbox.put(("closed", stats()["opened_blocks"]))


def holding_consumer(inbox, outbox, tensors=None):
    """Receives a tensor (from inbox, or from `tensors` once told to),
    reports its first bytes, then holds it until told to drop it (or
    killed)."""
    setup()
    if tensors is not None:
        inbox.get(timeout=TIMEOUT)
    t = (tensors or inbox).get(timeout=TIMEOUT)
    outbox.put(("received", bytes_of(t, 8)))
    inbox.get(timeout=TIMEOUT)
    del t
    gc.collect()
    outbox.put(("closed",))


def relay_consumer(inbox, outbox, onward):
    """Receives a tensor, sends it on to a third process, drops its own and
    stays until the third one has it."""
    setup()
    t = inbox.get(timeout=TIMEOUT)
    fill(t, 0x44, asynchronous=True)                # ordered by its event
    onward.put(t)
    onward.close()
    onward.join_thread()                            # pickled and sent
    del t
    gc.collect()
    outbox.put(("relayed", stats()["opened_blocks"]))
    inbox.get(timeout=TIMEOUT)
    outbox.put(("done",))


def third_consumer(onward, outbox, inbox):
    setup()
    t = onward.get(timeout=TIMEOUT)
    outbox.put(("third", bytes_of(t, 8)))
    fill(t, 0x55)
    outbox.put(("wrote",))
    inbox.get(timeout=TIMEOUT)
    del t
    gc.collect()
    outbox.put(("closed",))


def storage_consumer(inbox, outbox):
    setup()
    s = inbox.get(timeout=TIMEOUT)
    view = torch.empty((0,), dtype=torch.uint8).set_(s, 0, (s.nbytes(),),
                                                     (1,))
    outbox.put(("storage", type(s).__name__, s.nbytes(), bytes_of(view, 4)))
    del s, view
    gc.collect()
    outbox.put(("closed",))


def bouncing_consumer(inbox, outbox):
    """Receives tensors and sends each back at once, after a write queued
    on its stream (ordered for the producer by the interprocess event),
    until told to stop."""
    setup()
    while True:
        msg = inbox.get(timeout=TIMEOUT)
        if msg == "stop":
            break
        fill(msg, 0x3c, asynchronous=True)
        outbox.put(("back", msg))
        del msg
        gc.collect()
    outbox.put(("stopped", stats()["opened_blocks"]))


KEPT = []


def keeping_consumer(inbox, outbox):
    """Keeps what it received in a global: the interpreter exits with it
    alive, and frees it in its last collection."""
    setup()
    t = inbox.get(timeout=TIMEOUT)
    KEPT.append(t)
    outbox.put(("kept", bytes_of(t, 4)))


def argument_consumer(t, outbox):
    outbox.put(("argument", bytes_of(t, 4)))


def empty_consumer(inbox, outbox):
    setup()
    t = inbox.get(timeout=TIMEOUT)
    outbox.put(("empty", t.size(), t.dtype.name, t.untyped_storage().nbytes(),
                t.device.type, stats()["opened_blocks"]))
    del t
    gc.collect()


# ---- the producer's cases ---------------------------------------------------

def start(ctx, target, *args):
    p = ctx.Process(target=target, args=args)
    p.start()
    return p


def get(box, tag):
    msg = box.get(timeout=TIMEOUT)
    expect(msg[0] == tag, "expected %r, got %r" % (tag, msg))
    return msg


def case_round_trip(ctx):
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = start(ctx, round_trip_consumer, inbox, outbox)
    t = torch.empty(4096, dtype=torch.float32)
    fill(t, 0x11)
    latch = Latch()                                 # held: the next fill waits
    fill(t, 0x33, asynchronous=True)
    strided = t.as_strided((64, 8), (16, 2), 100)
    as_int = t.view(torch.int32)
    inbox.put((t, strided, as_int))
    _, same, meta, done, opened, opened_total = get(outbox, "received")
    expect(same, "views of one storage share one storage in the consumer")
    expect(meta == [("float32", (4096,), (1,), 0),
                    ("float32", (64, 8), (16, 2), 100),
                    ("int32", (4096,), (1,), 0)],
           "dtypes, shapes, strides and offsets arrive: %r" % (meta,))
    expect(opened == 1 and opened_total == 1,
           "one open for three tensors (%d, %d)" % (opened, opened_total))
    expect(not done, "the consumer's stream waits for the producer's held "
                     "work (the interprocess event)")
    s = stats()
    expect(s["open_by_others"] == 1, "the consumer holds the block")
    latch.open()
    inbox.put("go")
    _, head, head_int = get(outbox, "read")
    expect(head == b"\x33" * 16 and head_int == b"\x33" * 16,
           "the consumer read the bytes of the producer's queued work: %r"
           % head)
    get(outbox, "wrote")
    expect(bytes_of(t, 8) == b"\x22" * 8, "the producer sees the consumer's "
                                          "write")
    inbox.put("drop")
    _, still_open = get(outbox, "closed")
    expect(still_open == 0, "the consumer closed the block with its last "
                            "tensor")
    p.join(TIMEOUT)
    expect(p.exitcode == 0, "round-trip consumer exit %r" % p.exitcode)
    expect(stats()["open_by_others"] == 0, "no hold left")
    del t, strided, as_int


def case_producer_frees_first(ctx):
    inbox, outbox, tensors = ctx.Queue(), ctx.Queue(), ctx.Queue()
    p = start(ctx, holding_consumer, inbox, outbox, tensors)
    t = torch.empty(1 << 20, dtype=torch.uint8)
    nbytes = 1 << 20
    fill(t, 0x5a)
    tensors.put(t)
    tensors.close()
    tensors.join_thread()       # pickled (the queue's thread held t till then)
    del t                       # before the consumer even started
    settle()
    expect(stats()["pending_free_bytes"] == nbytes,
           "the ticket keeps the freed block pending (%d)" %
           stats()["pending_free_bytes"])
    inbox.put("go")             # only now does the consumer open it
    _, head = get(outbox, "received")
    expect(head == b"\x5a" * 8, "the consumer reads a block its producer "
                                "freed: %r" % head)
    settle()
    s = stats()
    expect(s["pending_free_bytes"] == nbytes and s["open_by_others"] == 1,
           "held by the consumer, still pending")
    inbox.put("drop")
    get(outbox, "closed")
    p.join(TIMEOUT)
    expect(p.exitcode == 0, "consumer exit %r" % p.exitcode)
    settle()
    s = stats()
    expect(s["pending_free_bytes"] == 0 and s["exported_blocks"] == 0,
           "given back once the consumer closed (%d pending)" %
           s["pending_free_bytes"])


def send_one(ctx, consumer, t, value):
    """t filled with `value` and sent to a new `consumer` process: the
    process and both its queues (the caller keeps the inbox alive: the
    process may not have unpickled it yet)."""
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = start(ctx, consumer, inbox, outbox)
    fill(t, value)
    inbox.put(t)
    return p, inbox, outbox


def case_consumer_killed(ctx):
    t = torch.empty(3 << 20, dtype=torch.float16)
    p, inbox, outbox = send_one(ctx, holding_consumer, t, 0x7b)
    _, head = get(outbox, "received")
    expect(head == b"\x7b" * 8, "consumer read the bytes")
    reclaimed = stats()["reclaimed"]
    del t
    settle()
    expect(stats()["pending_free_bytes"] == 6 << 20, "pending while held")
    os.kill(p.pid, signal.SIGKILL)
    p.join(TIMEOUT)
    expect(p.exitcode == -signal.SIGKILL, "killed (%r)" % p.exitcode)
    settle()
    s = stats()
    expect(s["pending_free_bytes"] == 0 and s["open_by_others"] == 0,
           "the killed consumer's hold is taken back (%d pending)" %
           s["pending_free_bytes"])
    expect(s["reclaimed"] == reclaimed + 1, "counted as reclaimed")


def failing_consumer(inbox, outbox):
    """Its first import of a block fails once (the emulator's fault)."""
    setup()
    cu().xsim_fail_call(b"cuMemImportFromShareableHandle",
                        ctypes.c_uint64(1), 999)      # CUDA_ERROR_UNKNOWN
    try:
        inbox.get(timeout=TIMEOUT)
        outbox.put(("opened", None))
    except Exception as e:                 # the unpickle failed
        outbox.put(("failed", str(e)))


def case_open_fails(ctx):
    """A consumer whose open fails gives the producer's ticket back: the
    producer's free then returns the block (before, it stayed pending
    until the producer exited)."""
    t = torch.empty(1 << 20, dtype=torch.uint8)
    p, inbox, outbox = send_one(ctx, failing_consumer, t, 0x5a)
    _, message = get(outbox, "failed")
    expect("cuMemImportFromShareableHandle" in message,
           "the failure names the driver call (%r)" % message)
    p.join(TIMEOUT)
    del t
    settle()
    s = stats()
    expect(s["pending_free_bytes"] == 0 and s["open_by_others"] == 0,
           "the failed open held nothing (%d pending)" %
           s["pending_free_bytes"])


def case_relay(ctx):
    outbox = ctx.Queue()
    relay_in, onward = ctx.Queue(), ctx.Queue()
    third_in, third_out = ctx.Queue(), ctx.Queue()
    relay = start(ctx, relay_consumer, relay_in, outbox, onward)
    third = start(ctx, third_consumer, onward, third_out, third_in)
    t = torch.empty(1 << 16, dtype=torch.int64)
    fill(t, 0x66)
    relay_in.put(t)
    _, relay_open = get(outbox, "relayed")
    expect(relay_open == 0, "the relay dropped its tensor after sending it")
    _, head = get(third_out, "third")
    expect(head == b"\x44" * 8, "the third process sees the relay's queued "
                                "write: %r" % head)
    get(third_out, "wrote")
    expect(bytes_of(t, 8) == b"\x55" * 8, "the producer sees the third's "
                                          "write")
    relay_in.put("bye")
    get(outbox, "done")
    relay.join(TIMEOUT)
    del t
    settle()
    expect(stats()["pending_free_bytes"] == 1 << 19,
           "the third process's hold keeps the freed block")
    third_in.put("drop")
    get(third_out, "closed")
    third.join(TIMEOUT)
    expect(relay.exitcode == 0 and third.exitcode == 0,
           "relay/third exits %r %r" % (relay.exitcode, third.exitcode))
    settle()
    expect(stats()["pending_free_bytes"] == 0, "given back after the third")


def case_back_home(ctx):
    """A tensor sent back to its producer arrives as the producer's own
    storage (as torch's shared_cache gives it): same pointer, nothing
    opened, its ticket given back; once the producer's storage is gone, it
    arrives as any other process's block would (a second mapping)."""
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = start(ctx, bouncing_consumer, inbox, outbox)
    t = torch.empty(1 << 12, dtype=torch.int32)
    fill(t, 0x10)
    opened = stats()["opened_blocks"]
    inbox.put(t.as_strided((4088,), (1,), 8))
    _, back = get(outbox, "back")
    expect(back.data_ptr() == t.data_ptr() + 32 and
           back.untyped_storage().data_ptr() == t.data_ptr(),
           "the producer's own memory came back (%#x, %#x)" %
           (back.data_ptr(), t.data_ptr()))
    expect(stats()["opened_blocks"] == opened, "nothing opened at home")
    expect(bytes_of(back, 4) == b"\x3c" * 4,
           "the consumer's queued write is seen (its event waited for)")
    expect(bytes_of(t, 4) == b"\x10" * 4, "the slice's front is untouched")
    del back
    # The producer's storage gone, a freed block kept by the ticket in
    # flight comes back as another process's block: opened here.
    inbox.put(t)
    del t
    gc.collect()
    _, back = get(outbox, "back")
    expect(stats()["opened_blocks"] == opened + 1,
           "a block whose storage died is opened (%d)" %
           stats()["opened_blocks"])
    expect(bytes_of(back, 4) == b"\x3c" * 4, "and reads the same bytes")
    del back
    gc.collect()
    inbox.put("stop")
    _, still = get(outbox, "stopped")
    expect(still == 0, "the consumer closed what it received")
    p.join(TIMEOUT)
    expect(p.exitcode == 0, "bouncing consumer exit %r" % p.exitcode)
    settle()
    s = stats()
    expect(s["pending_free_bytes"] == 0 and s["open_by_others"] == 0 and
           s["opened_blocks"] == opened,
           "no ticket or hold left (%d pending, %d held, %d open)" %
           (s["pending_free_bytes"], s["open_by_others"], s["opened_blocks"]))


def case_storage(ctx):
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = start(ctx, storage_consumer, inbox, outbox)
    t = torch.empty(1000, dtype=torch.uint8)
    fill(t, 0x21)
    inbox.put(t.untyped_storage())
    _, name, nbytes, head = get(outbox, "storage")
    expect(name == "UntypedStorage" and nbytes == 1000 and head == b"\x21" * 4,
           "an untyped storage arrives whole: %r %r %r" % (name, nbytes, head))
    get(outbox, "closed")
    p.join(TIMEOUT)
    expect(p.exitcode == 0, "storage consumer exit %r" % p.exitcode)


def case_empty(ctx):
    """An empty tensor: PyTorch asks a pluggable allocator even for 0 bytes,
    so its storage is an xseg block of its own, which torch's reduction
    would ask an IPC handle of (refused). It arrives as an empty tensor of
    the consumer's own, nothing exported or opened."""
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = start(ctx, empty_consumer, inbox, outbox)
    t = torch.empty(0, dtype=torch.float32)
    expect(t.data_ptr() != 0, "0 bytes asked of the allocator, as torch does")
    inbox.put(t)
    _, size, dt, nbytes, dev, opened = get(outbox, "empty")
    expect((size, dt, nbytes, dev, opened) == ((0,), "float32", 0, "cuda", 0),
           "an empty CUDA tensor arrives: %r" % ((size, dt, nbytes, dev,
                                                  opened),))
    expect(stats()["exported_blocks"] == 0, "nothing exported for it")
    p.join(TIMEOUT)
    expect(p.exitcode == 0, "empty consumer exit %r" % p.exitcode)
    del t


def case_kept_until_exit(ctx):
    """A consumer that still holds a received tensor when it exits (a
    global cache; a Process argument, which multiprocessing keeps): it exits
    cleanly (the storage's deleter, freed in the interpreter's last
    collection, used to call back into a torn-down module: SIGSEGV), and
    its hold goes with it."""
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = start(ctx, keeping_consumer, inbox, outbox)
    t = torch.empty(4096, dtype=torch.uint8)
    fill(t, 0x3C)
    inbox.put(t)
    _, head = get(outbox, "kept")
    p.join(TIMEOUT)
    expect(head == b"\x3c" * 4 and p.exitcode == 0,
           "a consumer exiting with a tensor kept exits cleanly: %r %r" %
           (head, p.exitcode))
    # Tensors as Process arguments: the parent keeps no fd per child
    # started once it runs (each used to stay open until the parent ended).
    counts = []
    for i in range(8):
        q = start(ctx, argument_consumer, t, outbox)
        get(outbox, "argument")
        q.join(TIMEOUT)
        expect(q.exitcode == 0, "argument consumer exit %r" % q.exitcode)
        q.close()
        counts.append(len(os.listdir("/proc/self/fd")))
    expect(counts[-1] <= counts[2], "fds held per started child: %r after "
           "each of eight" % counts)
    del t
    settle()
    expect(stats()["open_by_others"] == 0, "the exited consumers' holds went")


def case_sparse():
    """A compressed sparse tensor (CSR here), of which is_sparse is false
    and whose storage cannot be asked for (SparseCsrTensorImpl throws),
    keeps torch's reduction, which takes it apart by its layout."""
    from torch.multiprocessing import reductions
    t = torch.empty(16, dtype=torch.float32)
    t.layout = torch.sparse_csr

    def no_storage():
        raise NotImplementedError("Cannot access storage of "
                                  "SparseCsrTensorImpl")
    t.untyped_storage = no_storage
    try:
        rebuild, args = reductions.reduce_tensor(t)
        expect(rebuild is reductions.rebuild_sparse_tensor and
               args == ("sparse_csr",),
               "torch's sparse reduction ran: %r %r" % (rebuild, args))
    except NotImplementedError as err:
        expect(False, "a CSR tensor's storage was asked for: %s" % err)
    expect(hasattr(reductions.reduce_tensor, "xseg_wraps"),
           "xseg's reduction was the one called")


def case_not_xseg():
    """A storage that is no xseg block (here: inside one) keeps torch's own
    reduction, which refuses for a pluggable allocator."""
    t = torch.empty(4096, dtype=torch.uint8)
    inner = torch.UntypedStorage(t.data_ptr() + 512, 512, "cuda")
    from multiprocessing.reduction import ForkingPickler
    try:
        ForkingPickler.dumps(torch.Tensor(inner, torch.uint8, (512,), (1,), 0))
        expect(False, "a foreign storage was shared")
    except RuntimeError as err:
        expect("does not yet support shareIPcHandle" in str(err),
               "torch's own reduction ran: %s" % err)
    expect(stats()["exported_blocks"] == 0, "nothing exported")
    del t, inner


def main():
    setup()
    ctx = multiprocessing.get_context("spawn")
    for case in (case_round_trip, case_producer_frees_first,
                 case_consumer_killed, case_open_fails, case_relay,
                 case_back_home,
                 case_storage):
        print("--", case.__name__, flush=True)
        case(ctx)
    print("-- case_empty", flush=True)
    case_empty(ctx)
    print("-- case_kept_until_exit", flush=True)
    case_kept_until_exit(ctx)
    case_sparse()
    case_not_xseg()
    settle()
    s = stats()
    expect(s["pending_free_bytes"] == 0 and s["open_by_others"] == 0,
           "nothing pending or held at the end")
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
