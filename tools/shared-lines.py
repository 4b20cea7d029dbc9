#!/usr/bin/env python3
"""shared-lines.py: the cache lines that two threads on two streams share
in xseg's cached path, found from a trace of every memory access.

Two threads whose cached mallocs and frees touch a common cache line, one
of them writing it, pass that line between their cores at every pair: the
cost that makes two threads scale worse than two glibc loops. Hardware
counters (perf c2c) would show it, where a machine has them; this finds
it on any machine, exactly, from valgrind's lackey: tests/shared_lines.c
runs thread 0's turn, then thread 1's (each warmed up first, its measured
steps between two writes to a marker), and every access between the
marker's writes is that turn's thread's. A line written in one turn and
read or written in the other is shared.

    tools/shared-lines.py PROGRAM [--steps N] [--line BYTES] [--expect-shared]

PROGRAM is the built tests/shared_lines. --line sets the unit of sharing
(64 bytes unless given; 128 finds what an adjacent-line prefetcher, which
fetches lines in aligned pairs, would pass between cores). Exit status 0 when no line is
shared (with --expect-shared: when one is, the tool's own test with
PROGRAM's --share-a-counter), 1 otherwise, 2 when the trace is not what
it should be (no valgrind, markers missing, empty turns). A shared line is
printed with the instructions that wrote it (function, file:line).
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile


def run_traced(program, steps, share, trace_path):
    env = dict(os.environ)
    # valgrind cannot map the address space reserved for the emulator's
    # default 80 GiB; the debug check after every operation takes every
    # pair's lock, which is the sharing to find, not the cached path's.
    env.update(XSIM_DEVICE_MEMORY="4G", XSEG_DEBUG_CHECK="0")
    args = ["valgrind", "--tool=lackey", "--trace-mem=yes",
            "--log-file=" + trace_path, program, str(steps)]
    if share:
        args.append("--share-a-counter")
    done = subprocess.run(args, env=env, capture_output=True, text=True,
                          timeout=600)
    m = re.search(r"marker=(0x[0-9a-f]+)", done.stdout)
    if done.returncode != 0 or m is None:
        sys.exit("shared-lines: %s failed (status %d): %s%s" %
                 (program, done.returncode, done.stdout, done.stderr))
    return int(m.group(1), 16)


class Turn:
    def __init__(self):
        self.written = collections.Counter()   # line -> stores
        self.read = collections.Counter()      # line -> loads
        self.writers = collections.defaultdict(collections.Counter)


def read_turns(trace_path, marker, line_bits):
    """The two measured turns: accesses between the marker's first and
    second write (thread 0), third and fourth (thread 1)."""
    turns, writes, current, instr = [Turn(), Turn()], 0, None, None
    with open(trace_path) as f:
        for line in f:
            if line.startswith("I "):
                instr = int(line[3:line.index(",")], 16)
                continue
            if len(line) < 4 or line[0] != " " or line[1] not in "LSM":
                continue
            addr = int(line[3:line.index(",")], 16)
            kind = line[1]
            if addr == marker and kind in "SM":
                writes += 1
                current = turns[writes // 2] if writes in (1, 3) else None
                continue
            if current is None:
                continue
            cache_line = addr >> line_bits
            if kind in "SM":
                current.written[cache_line] += 1
                current.writers[cache_line][instr] += 1
            if kind in "LM":
                current.read[cache_line] += 1
    if writes != 4:
        sys.exit("shared-lines: the marker was written %d times, not 4" %
                 writes)
    for i, t in enumerate(turns):
        if not t.written or not t.read:
            sys.exit("shared-lines: thread %d's turn made no access" % i)
    return turns


def symbol_value(program, name):
    out = subprocess.run(["nm", program], capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == name:
            return int(parts[0], 16)
    return None


def describe(program, bias, instr):
    """Function and file:line of an instruction of the program."""
    if bias is None or shutil.which("addr2line") is None:
        return hex(instr)
    out = subprocess.run(["addr2line", "-f", "-i", "-e", program,
                          hex(instr - bias)], capture_output=True,
                         text=True).stdout.split("\n")
    if not out or out[0] == "??":
        return "%s (outside the program)" % hex(instr)
    frames = ["%s %s" % (out[i], os.path.basename(out[i + 1]))
              for i in range(0, len(out) - 1, 2)]
    return " < ".join(frames)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("program")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--line", type=int, default=64, choices=(64, 128))
    ap.add_argument("--expect-shared", action="store_true")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("shared-lines: valgrind not found (Debian: valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace")
        marker = run_traced(args.program, args.steps, args.expect_shared,
                            trace)
        line_bits = args.line.bit_length() - 1
        a, b = read_turns(trace, marker, line_bits)
    value = symbol_value(args.program, "turn_marker")
    bias = marker - value if value is not None else None
    shared = sorted(line for line in set(a.written) | set(b.written)
                    if (line in a.written and (line in b.written or
                                               line in b.read)) or
                    (line in b.written and line in a.read))
    print("shared-lines: %d-byte lines: thread 0 wrote %d lines and read %d, "
          "thread 1 wrote %d and read %d, in %d measured steps each" %
          (args.line, len(a.written), len(a.read), len(b.written),
           len(b.read), args.steps))
    for line in shared:
        print("shared line 0x%x: thread 0 %d stores %d loads, thread 1 %d "
              "stores %d loads" % (line << line_bits, a.written[line], a.read[line],
                                   b.written[line], b.read[line]))
        for t in (a, b):
            for instr, n in t.writers[line].most_common(3):
                print("    %6d stores by %s" %
                      (n, describe(args.program, bias, instr)))
    if args.expect_shared:
        print("shared-lines: %s" % ("found the shared line, as it must" if
                                    shared else "found no shared line, "
                                    "though the program shares one"))
        return 0 if shared else 1
    print("shared-lines: %d lines shared" % len(shared))
    return 1 if shared else 0


if __name__ == "__main__":
    sys.exit(main())
