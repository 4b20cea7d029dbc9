"""Carries a file descriptor to whichever process unpickles its carrier,
over one connection per pair of processes (xseg_multiprocessing's fds).

multiprocessing.reduction.DupFd does the same through the resource
sharer: every fd it carries costs the receiver a new connection to the
sender, with an authentication handshake both ways, about 250 us a fd on
a 2-core machine, most of what opening a shared tensor cost. Here each
sending process runs one listener (a thread, started with its first fd),
and each receiving process keeps its connection to every sender it has
heard from: the handshake (multiprocessing.connection's, with the
processes' authkey, as the resource sharer's) happens once per pair, and
each fd after it is one request and one SCM_RIGHTS message.

    carrier = send(fd)      # picklable; the sender keeps a dup of fd
    fd = carrier.detach()   # in the receiver: its own fd

As with DupFd, the sender holds the fd until a receiver detaches it (an
unpickled carrier that is never detached, or a sender that exits first,
leaves it unsent) and must run until then. A carrier detaches once.
After a fork, a child starts its own listener and its own connections.
A receiver closes its connections to senders that exited whenever it
opens a new one, so senders that come and go (a DataLoader's workers,
epoch after epoch) leave no fds behind.
"""

import itertools
import os
import threading
from multiprocessing import connection as _mp_connection
from multiprocessing import process as _mp_process
from multiprocessing import reduction as _mp_reduction

__all__ = ["send", "Carrier"]


class _Sender:
    """This process's listener and the fds it holds for receivers."""

    def __init__(self):
        self.lock = threading.Lock()
        self.held = {}                    # id -> fd (a dup, ours to close)
        self.ids = itertools.count(1)
        self.listener = _mp_connection.Listener(
            family="AF_UNIX", authkey=_mp_process.current_process().authkey)
        self.address = self.listener.address
        threading.Thread(target=self._accept, daemon=True,
                         name="xseg-fd-courier").start()

    def hold(self, fd):
        dup = os.dup(fd)
        with self.lock:
            ident = next(self.ids)
            self.held[ident] = dup
        return ident

    def _accept(self):
        while True:
            try:
                conn = self.listener.accept()
            except _mp_connection.AuthenticationError:
                continue                  # not one of ours: refused
            except OSError:
                return                    # the listener is gone
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name="xseg-fd-courier-conn").start()

    def _serve(self, conn):
        """One receiver: each request an id; each answer whether the fd is
        held, then the fd (SCM_RIGHTS) when it is."""
        with conn:
            while True:
                try:
                    ident = int(conn.recv())
                except (EOFError, OSError, ValueError, TypeError):
                    return
                with self.lock:
                    fd = self.held.pop(ident, None)
                try:
                    conn.send(fd is not None)
                    if fd is not None:
                        _mp_reduction.send_handle(conn, fd, None)
                except OSError:
                    return
                finally:
                    if fd is not None:
                        os.close(fd)

    def forget(self):
        """A forked child's copy: the fds are the parent's to send."""
        with self.lock:
            for fd in self.held.values():
                os.close(fd)
            self.held.clear()


_sender = None
_sender_lock = threading.Lock()


def _this_sender():
    global _sender
    with _sender_lock:
        if _sender is None:
            _sender = _Sender()
        return _sender


# The receiving side: one connection per sender's address, per process.
_receivers = {}
_receivers_lock = threading.Lock()


def _after_fork_in_child():
    """A forked child starts afresh: the parent's listener thread, its
    held fds and its connections are the parent's. The locks are new, as
    another thread may have held one at the fork."""
    global _sender, _sender_lock, _receivers_lock
    _sender_lock = threading.Lock()
    _receivers_lock = threading.Lock()
    if _sender is not None:
        _sender.lock = threading.Lock()
        _sender.forget()
        _sender = None
    for conn, _ in _receivers.values():
        conn.close()
    _receivers.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _prune_locked():
    """Closes the connections to senders that went away (a DataLoader's
    workers come and go with each epoch): a sender never writes unasked,
    so an idle connection with something to read has reached its end.
    Connections in use (their lock held) are left alone."""
    for address, (conn, lock) in list(_receivers.items()):
        if not lock.acquire(blocking=False):
            continue
        try:
            if conn.poll(0):
                conn.close()
                del _receivers[address]
        except OSError:
            del _receivers[address]
        finally:
            lock.release()


def _connection(address):
    with _receivers_lock:
        entry = _receivers.get(address)
        if entry is None:
            _prune_locked()
            conn = _mp_connection.Client(
                address, authkey=_mp_process.current_process().authkey)
            entry = _receivers[address] = (conn, threading.Lock())
        return entry


class Carrier:
    """A picklable claim on a fd some process holds for its receiver."""

    def __init__(self, address, ident):
        self.address = address
        self.ident = ident

    def detach(self):
        conn, lock = _connection(self.address)
        with lock:
            conn.send(self.ident)
            if not conn.recv():
                raise OSError("xseg_fd_courier: the sender holds no fd "
                              "%d (already taken)" % self.ident)
            return _mp_reduction.recv_handle(conn)


def send(fd):
    """A Carrier of a dup of fd, which this process holds until a
    receiver detaches it."""
    sender = _this_sender()
    return Carrier(sender.address, sender.hold(fd))

