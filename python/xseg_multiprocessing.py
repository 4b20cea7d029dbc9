"""torch.multiprocessing shares CUDA tensors through xseg.

PyTorch shares a CUDA tensor by asking its allocator for a CUDA IPC handle
(torch/multiprocessing/reductions.py: reduce_tensor -> storage._share_cuda_
-> CUDACachingAllocator::shareIpcHandle), which a pluggable allocator
refuses. install(lib), which xseg_torch.install() calls, replaces the
reductions torch registers on multiprocessing.reduction.ForkingPickler for
CUDA tensors and untyped storages (and the module functions
torch.multiprocessing.reductions.reduce_tensor / reduce_storage, which
libraries call directly) with ones that, for a block xseg allocated:

- export it (xseg_ipc_export) and send the handle (xseg_ipc_send) into one
  end of a Unix socket pair, whose other end travels to the receiver
  (xseg_fd_courier: taken by the receiver itself with pidfd_getfd where
  the kernel allows it, else over one connection per pair of processes,
  where multiprocessing's resource sharer made one per fd; to a child
  being spawned, in its inherited fd list), so one fd carries all of the
  handle's;
- take a ticket (xseg_ipc_ticket_take): the block stays pending after the
  producer frees it until the consumer has it open;
- record an interprocess event on the current stream (xseg_ipc_record):
  the consumer's current stream waits for it (xseg_ipc_wait), so the
  consumer sees the producer's queued work without the producer waiting.

The consumer opens the block (xseg_ipc_open), gives the ticket back, and
wraps it as a DLPack capsule (xseg_dlpack) whose deleter synchronizes the consumer's
current stream (as PyTorch's does) and closes it (xseg_ipc_close); the
tensor gets the sender's dtype, shape, strides and storage offset. Tensors
of one storage share one storage (one open) in the consumer. A consumer
may send a received tensor on: the producer's handle goes with it, with a
new ticket and the consumer's own event. A tensor that comes back to its
producer while the producer's storage lives arrives as that storage, not
as a second mapping of the same memory (torch's shared_cache does the
same): its ticket is given back, its sender's event waited for, and
nothing is opened. Everything else (CPU tensors, CUDA tensors of another
allocator) keeps torch's own reductions.

What this lifts of PyTorch's rules for CUDA sharing: the producer need not
keep the tensor alive while consumers use it (its free leaves the block
pending until the last consumer closed it, or died: SIGKILL included); a
received tensor can be sent on. Like every fd that multiprocessing sends,
the sender must run until the receiver has unpickled the tensor. A
consumer that dies after taking a tensor off a queue but before
unpickling it leaves the tensor's ticket unreturned: the block then stays
pending until the producer exits (torch's own CUDA sharing has the same
limit).
"""

import atexit
import ctypes
import os
import socket
import threading
from multiprocessing import context as _mp_context
from multiprocessing import reduction as _mp_reduction

import xseg_dlpack
import xseg_fd_courier

__all__ = ["install", "installed", "stats", "ShareError"]

XSEG_OK = 0
XSEG_ERR_UNKNOWN_POINTER = 3
EVENT_BYTES = 64


class ShareError(RuntimeError):
    """An xseg IPC call failed while sharing or receiving a tensor."""


# ---- the library ------------------------------------------------------------

class _Lib:
    """libxseg.so's IPC entry points, typed for ctypes (one per path)."""

    def __init__(self, path):
        self.path = path
        self.c = lib = ctypes.CDLL(path)
        vp, u64, i = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int
        pvp = ctypes.POINTER(ctypes.c_void_p)
        sigs = {
            "xseg_torch_allocator": (vp, [i]),
            "xseg_torch_has_allocator": (i, [i]),
            "xseg_torch_last_error": (ctypes.c_char_p, []),
            "xseg_last_error": (ctypes.c_char_p, []),
            "xseg_status_name": (ctypes.c_char_p, [i]),
            "xseg_ipc_export": (i, [vp, vp, pvp]),
            "xseg_ipc_send": (i, [i, vp]),
            "xseg_ipc_recv": (i, [i, pvp]),
            "xseg_ipc_handle_free": (None, [vp]),
            "xseg_ipc_open": (i, [vp, vp, pvp]),
            "xseg_ipc_close": (i, [vp, vp]),
            "xseg_ipc_ticket_take": (i, [vp, vp, ctypes.POINTER(u64)]),
            "xseg_ipc_ticket_give": (i, [vp, vp, u64]),
            "xseg_ipc_ticket_give_unopened": (i, [vp, u64]),
            "xseg_ipc_record": (i, [vp, vp, ctypes.c_char_p]),
            "xseg_ipc_wait": (i, [vp, ctypes.c_char_p, vp]),
            "xseg_get_stats": (i, [vp, vp]),
            "xseg_ipc_get_stats": (i, [vp, vp]),
        }
        for name, (res, args) in sigs.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args

    def check(self, status, what):
        if status != XSEG_OK:
            raise ShareError("%s: %s: %s" % (
                what, self.c.xseg_status_name(status).decode(),
                self.c.xseg_last_error().decode()))

    def allocator(self, device, create=True):
        """xseg's allocator of `device` (None if not created and not
        `create`)."""
        if not create and not self.c.xseg_torch_has_allocator(device):
            return None
        a = self.c.xseg_torch_allocator(device)
        if not a:
            raise ShareError("xseg allocator of device %d: %s" % (
                device, self.c.xseg_torch_last_error().decode()))
        return a


class _Stat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in
                ("current", "peak", "allocated", "freed")]


class _Stats(ctypes.Structure):
    """xseg.h's xseg_stats."""
    _fields_ = [(n, _Stat) for n in
                ("allocation", "segment", "active", "inactive_split",
                 "allocated_bytes", "reserved_bytes", "active_bytes",
                 "inactive_split_bytes", "requested_bytes")] + \
               [(n, ctypes.c_int64) for n in
                ("num_alloc_retries", "num_ooms", "num_sync_all_streams",
                 "num_device_alloc", "num_device_free", "mapped_bytes",
                 "pending_free_bytes", "handles_awaiting_release")]


_IPC_STATS = ("exported_blocks", "exported_total", "open_by_others",
              "pending_on_others", "reclaimed", "opened_blocks",
              "opened_total")


class _IpcStats(ctypes.Structure):
    """xseg.h's xseg_ipc_stats."""
    _fields_ = [(n, ctypes.c_int64) for n in _IPC_STATS]


_libs = {}
_lock = threading.Lock()
_shutting_down = []

# Which process exported a block: a token of its own (a pid can be reused
# by a later process, a token of 16 random bytes is not; a forked child
# draws its own) and the block's pointer there. It travels with every
# send, so that the block can be recognised when it comes back home.
_token = os.urandom(16)


def _after_fork_in_child():
    """A forked child is another process: a token of its own, none of its
    parent's exports, and a lock no other thread can hold (only the forking
    thread goes on)."""
    global _token, _lock
    _token = os.urandom(16)
    _lock = threading.Lock()
    _exported.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


_exported = {}         # pointer of a block exported here -> StorageWeakRef
_exported_prune_at = [64]


def _exported_add(ptr, storage):
    """Remembers the storage whose block this process exported at ptr (the
    newest: a pointer freed and allocated again names the new block)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    with _lock:
        _exported[ptr] = StorageWeakRef(storage)
        if len(_exported) >= _exported_prune_at[0]:
            for key in [k for k, ref in _exported.items() if ref.expired()]:
                del _exported[key]
            _exported_prune_at[0] = max(64, 2 * len(_exported))


def _home_storage(origin):
    """The live storage of a block this process exported, when `origin`
    names one, else None."""
    import torch
    if origin is None:
        return None
    token, ptr = origin
    if token != _token:
        return None
    with _lock:
        ref = _exported.get(ptr)
    if ref is None or ref.expired():
        return None
    return torch.UntypedStorage._new_with_weak_ptr(ref.cdata)


def _lib_at(path):
    with _lock:
        if path not in _libs:
            _libs[path] = _Lib(path)
        return _libs[path]


# ---- the consumer's imports -------------------------------------------------

def _stream_of(device):
    import torch
    return torch.cuda.current_stream(device)


class _Import:
    """A block of another process open here: the handle (kept to send the
    block on), the pointer, and the close that the tensor's storage deleter
    runs once torch frees the storage."""

    def __init__(self, lib, device, allocator, handle, ptr, nbytes, origin):
        self.lib, self.device, self.allocator = lib, device, allocator
        self.handle, self.ptr, self.nbytes = handle, ptr, nbytes
        self.origin = origin             # (the producer's token, pointer)
        self.storage_ref = None          # StorageWeakRef of its storage

    def close(self):
        if self.handle is None or _shutting_down:
            return                       # at exit the process unmaps all
        try:
            # The consumer's queued work may still use the block: PyTorch's
            # receiver synchronizes its current stream here too.
            _stream_of(self.device).synchronize()
        finally:
            self.lib.c.xseg_ipc_close(self.allocator, self.ptr)
            self.lib.c.xseg_ipc_handle_free(self.handle)
            self.handle = None
            with _lock:
                if _imports.get(self.ptr) is self:
                    del _imports[self.ptr]


_imports = {}          # pointer -> _Import, while its storage lives


def _import_of(ptr):
    with _lock:
        imp = _imports.get(ptr)
    if imp is None or imp.storage_ref is None or imp.storage_ref.expired():
        return None
    return imp


def _come_home(lib, device, carried, ticket, event, storage):
    """A block this process exported, back with its storage alive: the
    carried handle is dropped unopened, the ticket given back and the
    current stream made to wait for the sender's work."""
    os.close(carried.detach())           # the handle's fds go with it
    a = lib.allocator(device)
    ptr = ctypes.c_void_p(storage.data_ptr())
    lib.check(lib.c.xseg_ipc_ticket_give(a, ptr, ticket),
              "xseg_ipc_ticket_give")
    lib.check(lib.c.xseg_ipc_wait(a, event, _stream_of(device).cuda_stream),
              "xseg_ipc_wait")
    return storage


def _receive(path, device, carried, ticket, event, nbytes, origin):
    """The storage a producer sent: its own storage when it comes back to
    the process that exported it (_come_home), else opened (or the one
    already open here), its ticket given back, and the current stream made
    to wait for the producer's work on it."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    if carried is None:                  # empty (_share): nothing was sent
        return torch.empty((0,), dtype=torch.uint8,
                           device=torch.device("cuda", device)
                           ).untyped_storage()
    lib = _lib_at(path)
    home = _home_storage(origin)
    if home is not None:
        return _come_home(lib, device, carried, ticket, event, home)
    a = lib.allocator(device)
    fd = carried.detach()
    handle = ctypes.c_void_p()
    try:
        lib.check(lib.c.xseg_ipc_recv(fd, ctypes.byref(handle)),
                  "xseg_ipc_recv")
    finally:
        os.close(fd)
    ptr = ctypes.c_void_p()
    status = lib.c.xseg_ipc_open(a, handle, ctypes.byref(ptr))
    if status != XSEG_OK:
        failure = ShareError("xseg_ipc_open: %s: %s" % (
            lib.c.xseg_status_name(status).decode(),
            lib.c.xseg_last_error().decode()))
        # The producer's hold for this handle goes, or its block would
        # stay until the producer exits.
        lib.c.xseg_ipc_ticket_give_unopened(handle, ticket)
        lib.c.xseg_ipc_handle_free(handle)
        raise failure
    ptr = ptr.value
    failure = lib.c.xseg_ipc_ticket_give(a, ptr, ticket)
    if failure == XSEG_OK:
        stream = _stream_of(device)
        failure = lib.c.xseg_ipc_wait(a, event, stream.cuda_stream)
    if failure != XSEG_OK:
        message = lib.c.xseg_last_error().decode()
        lib.c.xseg_ipc_close(a, ptr)
        lib.c.xseg_ipc_handle_free(handle)
        raise ShareError("receiving a CUDA tensor: %s" % message)
    imp = _import_of(ptr)
    if imp is not None:
        storage = torch.UntypedStorage._new_with_weak_ptr(imp.storage_ref.cdata)
        if storage is not None:          # one storage, one open
            lib.c.xseg_ipc_close(a, ptr)
            lib.c.xseg_ipc_handle_free(handle)
            return storage
    imp = _Import(lib, device, a, handle, ptr, nbytes, origin)
    storage = xseg_dlpack.cuda_storage(ptr, nbytes, device, imp.close)
    imp.storage_ref = StorageWeakRef(storage)
    with _lock:
        _imports[ptr] = imp
    return storage


# ---- the producer's side ----------------------------------------------------

def _carry(lib, handle):
    """A picklable carrier of the handle's fds: the handle is sent into one
    end of a socket pair, the other end travels to the receiver: through
    this process's fd courier (xseg_fd_courier: pidfd_getfd, else one
    connection per pair of processes), or, for a child being spawned, as
    multiprocessing.DupFd, which the child inherits."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        lib.check(lib.c.xseg_ipc_send(ours.fileno(), handle), "xseg_ipc_send")
    finally:
        ours.close()
    if _mp_context.get_spawning_popen() is None:
        with theirs:                     # the courier holds a dup
            return xseg_fd_courier.send(theirs.fileno())
    carried = _mp_reduction.DupFd(theirs.fileno())
    _spawn_fds_prune()
    # The child inherits this very fd: it is kept until the child started.
    _spawn_fds.append((_mp_context.get_spawning_popen(), theirs))
    return carried


_spawn_fds = []        # (the spawning Popen, the fd its child inherits)


def _spawn_fds_prune():
    """Closes this process's copies of the fds children have inherited:
    a launched child (its Popen has a sentinel) holds its own."""
    keep = []
    for popen, sock in _spawn_fds:
        if getattr(popen, "sentinel", None) is not None:
            sock.close()
        else:
            keep.append((popen, sock))
    _spawn_fds[:] = keep


def _share(storage):
    """The rebuild arguments of a CUDA storage xseg allocated (or received),
    or None to leave it to torch."""
    ptr, nbytes = storage.data_ptr(), storage.nbytes()
    device = storage.device.index
    if ptr == 0 or _lib is None:
        return None
    lib = _lib
    if nbytes == 0:
        # PyTorch asks a pluggable allocator even for 0 bytes
        # (CUDAPluggableAllocator::allocate), and xseg gives each such
        # request a block of its own, so torch's way would ask the
        # allocator for an IPC handle and be refused. Nothing to share: the
        # receiver makes an empty storage of its own, as torch's
        # rebuild_cuda_tensor does for a storage sent without a handle.
        return (lib.path, device, None, 0, b"", 0, None)
    imp = _import_of(ptr)
    if imp is not None:                  # received here: send it on
        a, handle, own, origin = imp.allocator, imp.handle, False, imp.origin
    else:
        a = lib.allocator(device, create=False)
        if a is None:
            return None
        handle = ctypes.c_void_p()
        status = lib.c.xseg_ipc_export(a, ptr, ctypes.byref(handle))
        if status == XSEG_ERR_UNKNOWN_POINTER:
            return None                  # not xseg's: torch's own way
        lib.check(status, "xseg_ipc_export")
        own, origin = True, (_token, ptr)
        _exported_add(ptr, storage)
    ticket = ctypes.c_uint64()
    event = ctypes.create_string_buffer(EVENT_BYTES)
    try:
        lib.check(lib.c.xseg_ipc_ticket_take(a, ptr, ctypes.byref(ticket)),
                  "xseg_ipc_ticket_take")
        try:
            stream = _stream_of(device)
            lib.check(lib.c.xseg_ipc_record(a, stream.cuda_stream, event),
                      "xseg_ipc_record")
            carried = _carry(lib, handle)
        except BaseException:
            lib.c.xseg_ipc_ticket_give(a, ptr, ticket.value)
            raise
    finally:
        if own:
            lib.c.xseg_ipc_handle_free(handle)
    return (lib.path, device, carried, ticket.value, event.raw, nbytes,
            origin)


def _rebuild_storage(storage_cls, path, device, carried, ticket, event,
                     nbytes, origin):
    return _receive(path, device, carried, ticket, event, nbytes, origin)


def _rebuild_tensor(tensor_cls, size, stride, offset, dtype, requires_grad,
                    path, device, carried, ticket, event, nbytes, origin):
    import torch
    storage = _receive(path, device, carried, ticket, event, nbytes, origin)
    t = torch.empty((0,), dtype=dtype, device=storage.device)
    t = t.set_(storage, offset, size, stride)
    # As torch's rebuild_cuda_tensor: integer parameters need
    # requires_grad=False in the constructor.
    if tensor_cls == torch.nn.parameter.Parameter:
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t


def _xseg_storage(tensor):
    """The untyped CUDA storage of a strided tensor we may share, else None
    (sparse and nested tensors keep torch's reductions, which take them
    apart into strided ones). The layout decides, as in torch's
    reduce_tensor: is_sparse is true of the COO layout alone, and the
    compressed ones (CSR, CSC, BSR, BSC) have no storage to ask for."""
    import torch
    if tensor.is_nested or tensor.layout != torch.strided or \
            tensor.device.type != "cuda":
        return None
    return tensor.untyped_storage()


def _reduce_tensor_with(torch_reduce):
    def reduce_tensor(tensor):
        storage = _xseg_storage(tensor)
        if storage is not None:
            if tensor.requires_grad and not tensor.is_leaf:
                # torch's own refusal, with its words.
                return torch_reduce(tensor)
            shared = _share(storage)
            if shared is not None:
                return (_rebuild_tensor,
                        (type(tensor), tuple(tensor.size()),
                         tuple(tensor.stride()), tensor.storage_offset(),
                         tensor.dtype, tensor.requires_grad) + shared)
        return torch_reduce(tensor)
    reduce_tensor.xseg_wraps = torch_reduce
    return reduce_tensor


def _reduce_storage_with(torch_reduce):
    def reduce_storage(storage):
        if storage.device.type == "cuda":
            shared = _share(storage)
            if shared is not None:
                return (_rebuild_storage, (type(storage),) + shared)
        return torch_reduce(storage)
    reduce_storage.xseg_wraps = torch_reduce
    return reduce_storage


# ---- install ----------------------------------------------------------------

_lib = None


def installed():
    """True once install() has run in this process."""
    return _lib is not None


def _wrap(reducers, cls, make):
    current = reducers.get(cls)
    if current is not None and not hasattr(current, "xseg_wraps"):
        _mp_reduction.ForkingPickler.register(cls, make(current))


def install(lib):
    """Makes torch.multiprocessing share CUDA tensors (and untyped storages)
    that xseg allocated through xseg's IPC. `lib`: the path of libxseg.so,
    or an object with a `path` (xseg_torch.Library). Idempotent."""
    global _lib
    import torch
    import torch.multiprocessing.reductions as reductions
    _lib = _lib_at(getattr(lib, "path", lib))
    reducers = _mp_reduction.ForkingPickler._extra_reducers
    tensor_classes = {torch.Tensor, torch.nn.parameter.Parameter}
    tensor_classes.update(getattr(torch, "_tensor_classes", ()))
    for cls in tensor_classes:
        _wrap(reducers, cls, _reduce_tensor_with)
    _wrap(reducers, torch.UntypedStorage, _reduce_storage_with)
    for name, make in (("reduce_tensor", _reduce_tensor_with),
                       ("reduce_storage", _reduce_storage_with)):
        current = getattr(reductions, name)
        if not hasattr(current, "xseg_wraps"):
            setattr(reductions, name, make(current))


def stats(device=0):
    """What sharing leaves on `device`: xseg's pending_free_bytes (freed
    blocks waiting, here for other processes to close them) and the
    counts of xseg_ipc_get_stats (exported_blocks, open_by_others,
    pending_on_others, reclaimed, opened_blocks, ...). Zeros before the
    device's allocator exists."""
    out = dict.fromkeys(("pending_free_bytes",) + _IPC_STATS, 0)
    lib = _lib
    a = lib.allocator(device, create=False) if lib is not None else None
    if a is None:
        return out
    raw, ipc = _Stats(), _IpcStats()
    lib.check(lib.c.xseg_get_stats(a, ctypes.byref(raw)), "xseg_get_stats")
    lib.check(lib.c.xseg_ipc_get_stats(a, ctypes.byref(ipc)),
              "xseg_ipc_get_stats")
    out["pending_free_bytes"] = raw.pending_free_bytes
    out.update((n, getattr(ipc, n)) for n in _IPC_STATS)
    return out


@atexit.register
def _at_exit():
    _shutting_down.append(True)
    for _, sock in _spawn_fds:
        sock.close()
    # (Received storages still alive: xseg_dlpack's own exit handler.)
