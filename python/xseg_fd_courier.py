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

Where the kernel lets the receiver take the fd itself (pidfd_getfd, Linux
5.6, allowed by the ptrace rules: the same user, and under Yama's
ptrace_scope 1 only an ancestor of the sender, as a DataLoader's main
process of its workers; a container's seccomp profile may refuse it), it
does: no round trip, and no wait for the sender's thread to get the GIL.
It then tells the sender, without waiting for an answer, to close its
dup. The fd taken is checked to be the one the carrier names (its inode),
so a number the sender reused, or a sender's pid reused by another
process, is never taken for it. Otherwise, or with XSEG_FD_COURIER_PIDFD=0
in the receiver's environment, the fd comes through the connection.

As with DupFd, the sender holds the fd until a receiver detaches it (an
unpickled carrier that is never detached, or a sender that exits first,
leaves it unsent) and must run until then. A carrier detaches once
(two copies unpickled from one pickle may both get the fd while the
sender has not yet closed its dup after the first took it itself).
After a fork, a child starts its own listener and its own connections.
A receiver closes its connections to senders that exited whenever it
opens a new one, so senders that come and go (a DataLoader's workers,
epoch after epoch) leave no fds behind.
"""

import ctypes
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
        """The id and the number of the dup of fd held for a receiver."""
        dup = os.dup(fd)
        with self.lock:
            ident = next(self.ids)
            self.held[ident] = dup
        return ident, dup

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
        held, then the fd (SCM_RIGHTS) when it is. A negative id: the
        receiver took the fd itself (pidfd_getfd); its dup is closed, and
        nothing is answered."""
        with conn:
            while True:
                try:
                    ident = int(conn.recv())
                except (EOFError, OSError, ValueError, TypeError):
                    return
                with self.lock:
                    fd = self.held.pop(abs(ident), None)
                if ident < 0:
                    if fd is not None:
                        os.close(fd)
                    continue
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


_SYS_PIDFD_GETFD = 438          # the same number on every architecture
# How this process's detaches went: taken itself, or sent by the sender.
counts = {"pidfd": 0, "sent": 0}
_libc = None


def _take_by_pidfd(pid, number, inode):
    """The sender's fd `number` taken into this process, or None where the
    kernel does not allow it or it is not the file of that inode."""
    global _libc
    if os.environ.get("XSEG_FD_COURIER_PIDFD") == "0" or \
            not hasattr(os, "pidfd_open"):
        return None
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        fd = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, number, 0)
    finally:
        os.close(pidfd)
    if fd < 0:
        return None
    if os.fstat(fd).st_ino != inode:
        os.close(fd)
        return None
    return fd


class Carrier:
    """A picklable claim on a fd some process holds for its receiver: the
    sender's listener, the fd's id there, and for pidfd_getfd the sender's
    pid, the fd's number and its inode."""

    def __init__(self, address, ident, pid=None, number=None, inode=None):
        self.address = address
        self.ident = ident
        self.pid, self.number, self.inode = pid, number, inode
        self.detached = False

    def __getstate__(self):
        return (self.address, self.ident, self.pid, self.number, self.inode)

    def __setstate__(self, state):
        self.__init__(*state)

    def detach(self):
        if self.detached:
            raise OSError("xseg_fd_courier: fd %d already taken through "
                          "this carrier" % self.ident)
        self.detached = True
        fd = None
        if self.pid is not None:
            fd = _take_by_pidfd(self.pid, self.number, self.inode)
        if fd is not None:
            counts["pidfd"] += 1
            try:                                # close your dup; no answer
                conn, lock = _connection(self.address)
                with lock:
                    conn.send(-self.ident)
            except (OSError, EOFError, _mp_connection.AuthenticationError):
                pass              # the sender keeps its dup until it exits
            return fd
        try:
            conn, lock = _connection(self.address)
        except (FileNotFoundError, ConnectionRefusedError) as err:
            raise OSError(
                "xseg_fd_courier: the sending process (pid %s) exited before "
                "this was unpickled; a sender must run until its receivers "
                "have unpickled what it sent" % (self.pid or "?")) from err
        with lock:
            conn.send(self.ident)
            if not conn.recv():
                raise OSError("xseg_fd_courier: the sender holds no fd "
                              "%d (already taken)" % self.ident)
            fd = _mp_reduction.recv_handle(conn)
            counts["sent"] += 1
            return fd


def send(fd):
    """A Carrier of a dup of fd, which this process holds until a
    receiver detaches it."""
    sender = _this_sender()
    ident, number = sender.hold(fd)
    return Carrier(sender.address, ident, os.getpid(), number,
                   os.fstat(number).st_ino)

