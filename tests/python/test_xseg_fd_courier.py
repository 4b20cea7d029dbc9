"""python/xseg_fd_courier.py between real processes (spawn and fork), with
no GPU and no torch: the fds it carries arrive and work, many of them over
one connection per pair of processes, each once, taken by the receiver
itself (pidfd_getfd) where the kernel allows it and sent otherwise (also
forced, XSEG_FD_COURIER_PIDFD=0); what a forked child
inherits of its parent's held fds is not sent twice; connections to
senders that exited are closed; a process with another authkey is
refused.

Environment: PYTHONPATH=python/ (set by tests/CMakeLists.txt).
"""
import multiprocessing
import os
import pickle
import sys
import time
from multiprocessing import process as _mp_process

import xseg_fd_courier
from expect import expect, failures

TIMEOUT = 60
N = 50


def pipe_with(data):
    """The read end of a pipe that holds `data`."""
    r, w = os.pipe()
    os.write(w, data)
    os.close(w)
    return r


def receiver(inbox, outbox, pidfd):
    """Detaches every carrier it gets, reads what its fd holds, tries one
    carrier twice; reports what it read, how many connections it made and
    how its fds came. `pidfd` "0": the fds come through the connection."""
    if pidfd is not None:
        os.environ["XSEG_FD_COURIER_PIDFD"] = pidfd
    got, again = [], None
    carriers = inbox.get(timeout=TIMEOUT)
    for c in carriers:
        fd = c.detach()
        got.append(os.read(fd, 64))
        os.close(fd)
    try:
        carriers[0].detach()
    except OSError as err:
        again = str(err)
    outbox.put((got, again, len(xseg_fd_courier._receivers),
                dict(xseg_fd_courier.counts)))


def many_fds_one_connection(ctx, pidfd):
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=receiver, args=(inbox, outbox, pidfd))
    p.start()
    carriers = []
    for i in range(N):
        r = pipe_with(b"fd %d" % i)
        carriers.append(xseg_fd_courier.send(r))
        os.close(r)                      # the courier keeps its own dup
    inbox.put(carriers)
    got, again, connections, counts = outbox.get(timeout=TIMEOUT)
    p.join(TIMEOUT)
    expect(p.exitcode == 0, "the receiver exited cleanly")
    expect(got == [b"fd %d" % i for i in range(N)],
           "every fd arrived, in order, with its pipe's bytes")
    expect(again is not None and "already taken" in again,
           "a carrier detaches once (got %r)" % again)
    expect(connections == 1, "%d fds over one connection (%d)" %
           (N, connections))
    # The receiver's notices that it took an fd itself come unanswered:
    # the sender closes its dups a moment later.
    for _ in range(100):
        if not xseg_fd_courier._sender.held:
            break
        time.sleep(0.05)
    expect(not xseg_fd_courier._sender.held,
           "the sender holds nothing once every fd was taken")
    expect(counts["pidfd"] + counts["sent"] == N, "every fd counted once")
    if pidfd == "0":
        expect(counts["pidfd"] == 0, "XSEG_FD_COURIER_PIDFD=0: every fd "
               "sent (%r)" % counts)
    else:
        # Taken by pidfd_getfd where the kernel allows it (this spawned
        # child from its parent: not under Yama's ptrace_scope 1, nor under
        # a seccomp profile that refuses it), else all sent.
        expect(counts["pidfd"] in (0, N), "one way for all (%r)" % counts)
    print("   fds taken by pidfd_getfd: %d, sent: %d" %
          (counts["pidfd"], counts["sent"]), flush=True)


def case_many_fds_one_connection(ctx):
    many_fds_one_connection(ctx, None)


def case_many_fds_one_connection_sent(ctx):
    many_fds_one_connection(ctx, "0")


def forked_sender(outbox, inbox):
    """A forked child's carriers: its own listener, its own fds. Alive
    until the parent has detached."""
    r = pipe_with(b"from the child")
    c = xseg_fd_courier.send(r)
    os.close(r)
    outbox.put((pickle.dumps(c), len(xseg_fd_courier._sender.held)))
    inbox.get(timeout=TIMEOUT)


def case_forked_child(ctx_fork):
    # A fd held here before the fork: the child must not send it.
    r = pipe_with(b"from the parent")
    parent_carrier = xseg_fd_courier.send(r)
    os.close(r)
    outbox, inbox = ctx_fork.Queue(), ctx_fork.Queue()
    p = ctx_fork.Process(target=forked_sender, args=(outbox, inbox))
    p.start()
    blob, child_held = outbox.get(timeout=TIMEOUT)
    child_carrier = pickle.loads(blob)
    expect(child_held == 1, "the child holds its own fd alone (%d)" %
           child_held)
    expect(child_carrier.address != parent_carrier.address,
           "the child listens at an address of its own")
    fd = child_carrier.detach()
    expect(os.read(fd, 64) == b"from the child", "the child's fd arrived")
    os.close(fd)
    fd = parent_carrier.detach()          # to this very process
    expect(os.read(fd, 64) == b"from the parent",
           "the parent's own carrier detaches in the parent")
    os.close(fd)
    inbox.put("done")
    p.join(TIMEOUT)
    expect(p.exitcode == 0, "the forked child exited cleanly")


def short_lived_sender(outbox):
    """A sender that exits once its fd was taken (a DataLoader worker)."""
    r = pipe_with(b"short")
    outbox.put(xseg_fd_courier.send(r))
    os.close(r)
    outbox.get(timeout=TIMEOUT)


def case_senders_that_exit_leave_nothing(ctx):
    """Senders come and go: the receiver here keeps at most the
    connections of those alive (a pruned one was closed)."""
    before = len(xseg_fd_courier._receivers)
    for i in range(5):
        outbox = ctx.Queue()
        p = ctx.Process(target=short_lived_sender, args=(outbox,))
        p.start()
        carrier = outbox.get(timeout=TIMEOUT)
        fd = carrier.detach()
        ok = os.read(fd, 64) == b"short"
        os.close(fd)
        outbox.put("done")
        p.join(TIMEOUT)
        expect(ok and p.exitcode == 0, "sender %d's fd arrived" % i)
    expect(len(xseg_fd_courier._receivers) <= before + 1,
           "connections to exited senders are closed (%d kept)" %
           (len(xseg_fd_courier._receivers) - before))


def stranger(address, ident, outbox):
    """A process with another authkey, asking through the connection (one
    that may take the sender's fds with pidfd_getfd may read its memory
    too: the authkey keeps out only those that may not)."""
    os.environ["XSEG_FD_COURIER_PIDFD"] = "0"
    _mp_process.current_process().authkey = b"not the same key"
    try:
        xseg_fd_courier.Carrier(address, ident).detach()
        outbox.put("sent")
    except Exception as err:             # refused at the handshake
        outbox.put(type(err).__name__)


def case_other_authkey_refused(ctx):
    r = pipe_with(b"secret")
    c = xseg_fd_courier.send(r)
    os.close(r)
    outbox = ctx.Queue()
    p = ctx.Process(target=stranger, args=(c.address, c.ident, outbox))
    p.start()
    answer = outbox.get(timeout=TIMEOUT)
    p.join(TIMEOUT)
    expect(answer != "sent", "a process with another authkey gets no fd "
           "(%s)" % answer)
    fd = c.detach()                       # still held for a rightful one
    expect(os.read(fd, 64) == b"secret", "the refused fd stays held")
    os.close(fd)


def gone_sender(outbox):
    """A sender that exits before its fd is taken."""
    r = pipe_with(b"gone")
    outbox.put(xseg_fd_courier.send(r))
    os.close(r)


def case_sender_gone_is_named(ctx):
    """A carrier whose sender exited before it was detached: an error that
    says so, not the bare FileNotFoundError of its listener's path."""
    os.environ["XSEG_FD_COURIER_PIDFD"] = "0"    # through the connection
    try:
        outbox = ctx.Queue()
        p = ctx.Process(target=gone_sender, args=(outbox,))
        p.start()
        carrier = outbox.get(timeout=TIMEOUT)
        p.join(TIMEOUT)
        try:
            os.close(carrier.detach())
            expect(False, "an exited sender's fd arrived")
        except OSError as err:
            expect("exited before" in str(err) and
                   str(p.pid) in str(err), "the cause is named: %s" % err)
    finally:
        del os.environ["XSEG_FD_COURIER_PIDFD"]


def main():
    spawn = multiprocessing.get_context("spawn")
    for case, ctx in ((case_many_fds_one_connection, spawn),
                      (case_many_fds_one_connection_sent, spawn),
                      (case_forked_child, multiprocessing.get_context("fork")),
                      (case_senders_that_exit_leave_nothing, spawn),
                      (case_other_authkey_refused, spawn),
                      (case_sender_gone_is_named, spawn)):
        print("--", case.__name__, flush=True)
        case(ctx)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
