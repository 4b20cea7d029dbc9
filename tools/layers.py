#!/usr/bin/env python3
"""layers.py: the library's file-level call graph, from its object files.

Reads `nm` of every object file of the library in a build directory (the
objects of the CMake object libraries xseg_<layer>), draws an edge from
file A to file B when A's object uses a symbol that B's object defines (a
call, a variable, a thread-local), and fails when

  - files call each other in a circle (a strongly connected component of
    more than one file), or
  - a file calls up the layers: vmm < segments < streams < alloc, and
    inside alloc/ up its rooms (ALLOC_ROOMS below, lowest first), or
  - a file of alloc/ includes a header of a higher room (what an inline
    function or a struct brings leaves no symbol to see), or
  - a function breaks the lock rule of docs/DESIGN.md 2.1 ("the lock a
    function needs is in its name"): it calls a function named `_locked`
    (every lock held) but is not `_locked` itself, does not take every
    lock (xs_alloc_enter), and its first comment line does not say
    "every lock". Read from the objects' code (`objdump -dr`), so only
    calls that are out of line in that build count: a Debug build sees
    every static helper, an optimised one fewer;
  - a function of alloc/ asserts a lock its name and its first comment
    line (or its prototype's) do not name: XS_ASSERT_LOCKED (every lock)
    outside a `_locked` function whose first line does not say "every
    lock", or XS_ASSERT_PAIR_LOCKED outside a function named `_locked`,
    `_pair`, `xs_pair_*` or `xs_park_*` whose first line names no lock.
    Read from the sources, so it holds in every build.

An inline function of a header counts where it lands: a call it makes that
the compiler leaves out of line is the including file's. That is the point:
a header of a lower layer that calls up is an upward call wherever it is
inlined.

Usage: tools/layers.py BUILD_DIR [--graph] [--repo DIR]
  --graph  also prints every edge (file -> file: symbols).
  --repo   the sources' tree (default: the one this script is in).
Exit status 0 when none of the above is found, 1 otherwise.
"""
import fnmatch
import os
import re
import subprocess
import sys
from collections import defaultdict

LAYERS = ["vmm", "segments", "streams", "alloc"]
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


# alloc/'s rooms, lowest first (docs/DESIGN.md says why each exists): a
# file calls only files of its own room or of rooms before it. Names or
# shell patterns; a new file of alloc/ that none matches is reported.
ALLOC_ROOMS = [
    ("base", "thread.c ptrtable.c trace.c policy.c config.c capture_mode.c"),
    ("pairs", "ranges.c pairs.c"),
    ("enter", "check.c enter.c"),
    ("capture", "capture.c"),
    ("deferred", "deferred.c"),
    ("ipc", "ipc_*.c"),
    ("growth", "frees.c physical.c flow.c reclaim.c grow.c cache.c"),
    ("introspection", "stats.c snapshot.c"),
    ("entry", "alloc.c free.c create.c"),
    ("torch", "torch*.c"),
]


def room_of(path):
    """The index in ALLOC_ROOMS of a file of alloc/, or None."""
    name = path[len("alloc/"):]
    for i, (_, files) in enumerate(ALLOC_ROOMS):
        if any(fnmatch.fnmatchcase(name, f) for f in files.split()):
            return i
    return None


# Headers of alloc/ whose room is not that of the .c file of the same name.
HEADER_ROOMS = {"types.h": "base", "account.h": "base", "park.h": "pairs",
                "ipc.h": "ipc"}


def header_room(name):
    """The index in ALLOC_ROOMS of header alloc/<name>, or None."""
    names = [n for n, _ in ALLOC_ROOMS]
    if name in HEADER_ROOMS:
        return names.index(HEADER_ROOMS[name])
    return room_of("alloc/" + name[:-2] + ".c")


def include_problems():
    """Lines about includes of alloc/'s headers that go up its rooms."""
    out = []
    top = os.path.join(REPO, "alloc")
    if not os.path.isdir(top):
        return out
    names = [n for n, _ in ALLOC_ROOMS]
    for f in sorted(os.listdir(top)):
        if f.endswith(".c"):
            mine = room_of("alloc/" + f)
        elif f.endswith(".h"):
            mine = header_room(f)
        else:
            continue
        if mine is None:
            if f.endswith(".h"):
                out.append(f"alloc/{f}: in no room of alloc/ "
                           "(tools/layers.py, HEADER_ROOMS)")
            continue
        with open(os.path.join(top, f)) as src:
            for line in src:
                m = re.match(r'\s*#\s*include\s+"alloc/([\w.]+\.h)"', line)
                if m is None:
                    continue
                theirs = header_room(m.group(1))
                if theirs is not None and theirs > mine:
                    out.append(f"upward include: alloc/{f} ({names[mine]}) "
                               f"-> alloc/{m.group(1)} ({names[theirs]})")
    return out


def rank(path):
    """(layer, room) of a source path: rooms only inside alloc/."""
    layer = LAYERS.index(path.split("/")[0])
    room = room_of(path) if path.startswith("alloc/") else None
    return (layer, -1 if room is None else room)


def objects(build):
    """{source path relative to the repository: object path} of the library:
    the objects of the object libraries xseg_<layer> (CMakeLists.txt)."""
    found = {}
    for layer in LAYERS:
        root = os.path.join(build, "CMakeFiles", f"xseg_{layer}.dir")
        if not os.path.isdir(root):   # a build of one object library for all
            root = os.path.join(build, "CMakeFiles", "xseg_objects.dir")
        for dirpath, _, files in os.walk(root):
            for f in files:
                if not f.endswith(".c.o"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f[:-2]), root)
                # An object whose source is gone is a stale leftover.
                if rel.split("/")[0] == layer and \
                        os.path.exists(os.path.join(REPO, rel)):
                    found[rel] = os.path.join(dirpath, f)
    return found


def symbols(obj):
    """(defined, used) global symbols of one object file."""
    out = subprocess.run(["nm", "-P", obj], check=True, capture_output=True,
                         text=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        name, kind = fields[0], fields[1]
        if kind == "U":
            used.add(name)
        elif kind.isupper() or kind in "uvw":
            defined.add(name)
    return defined, used


def graph(objs):
    """{file: {file: [symbols]}}: who uses whom."""
    owner, uses = {}, {}
    for src, obj in objs.items():
        defined, used = symbols(obj)
        for name in defined:
            owner[name] = src
        uses[src] = used
    edges = defaultdict(lambda: defaultdict(list))
    for src, used in uses.items():
        for name in sorted(used):
            dst = owner.get(name)
            if dst is not None and dst != src:
                edges[src][dst].append(name)
    return edges


def circles(nodes, edges):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        work = [(v, iter(sorted(edges.get(v, {}))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, {})))))
                    advanced = True
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


# The functions that take or drop every lock themselves: what they call
# runs with every lock held although their names do not say so.
LOCK_TAKERS = {"xs_alloc_enter", "xs_alloc_leave"}


def base_name(symbol):
    """A function's name without GCC's clone suffixes (.constprop.0 ...)."""
    return symbol.split(".")[0]


def calls(obj):
    """{function: {callee}} of one object file, from its code: relocations
    and direct calls or jumps to a named function."""
    out = subprocess.run(["objdump", "-dr", "--no-show-raw-insn", obj],
                         check=True, capture_output=True, text=True).stdout
    found, cur = {}, None
    for line in out.splitlines():
        m = re.match(r"^[0-9a-f]+ <([^>]+)>:$", line)
        if m:
            cur = base_name(m.group(1))
            found.setdefault(cur, set())
            continue
        if cur is None:
            continue
        m = re.search(r"\bR_[A-Z0-9_]+\s+([A-Za-z_][\w.]*)", line) or \
            re.search(r"\b(?:call|jmp|bl?)\w*\s+[0-9a-f]+ <([A-Za-z_][\w.]*)",
                      line)
        if m:
            found[cur].add(base_name(m.group(1)))
    return found


def first_comment_line(path, name):
    """The first line of the comment just above the definition of `name`
    in source file `path`, or in a header beside it (an inline function
    left out of line), or, when the definition has none, above its
    prototype in such a header (where a function's comment lives when
    other files call it); "" when there is none."""
    folder = os.path.dirname(path)
    headers = sorted(os.path.join(folder, h) for h in os.listdir(folder)
                     if h.endswith(".h"))
    for source in [path] + headers:
        line = comment_above(source, name)
        if line is not None:
            break
    if line:
        return line
    for header in headers:
        line = comment_above(header, name, prototype=True)
        if line:
            return line
    return ""


def comment_above(path, name, prototype=False):
    """first_comment_line in one file: None when `name` is not defined
    there (not declared, with `prototype`)."""
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if line[:1].isspace() or \
                not re.search(r"\b" + re.escape(name) + r"\(", line):
            continue
        rest = " ".join(lines[i:i + 12])
        body, decl = rest.find("{"), rest.find(";")
        if prototype:
            if decl < 0 or (0 <= body < decl):
                continue                        # a definition or a call
        elif body < 0 or (0 <= decl < body):
            continue                            # a prototype or a call
        j = i - 1
        # A head on several lines: its return type above its name.
        while j >= 0 and lines[j].strip() and \
                not lines[j].rstrip().endswith(("*/", ";", "}", "{")) and \
                not lines[j].startswith("#"):
            j -= 1
        if j < 0 or not lines[j].rstrip().endswith("*/"):
            return ""
        while j >= 0 and not lines[j].lstrip().startswith("/*"):
            j -= 1
        return lines[j] if j >= 0 else ""
    return None


# __attribute__((...)) in a function's head, which comes before its name.
ATTRIBUTE = re.compile(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)")


def enclosing_function(text, at):
    """The name of the function whose body holds offset `at` of a C
    source, or None: the first head at column 0 after the previous
    function's closing brace."""
    start = text.rfind("\n}", 0, at)
    start = 0 if start < 0 else start + 2
    for m in re.finditer(r"^[A-Za-z_][^;{}#]*?\(", text[start:at], re.M):
        head = text[start + m.start():at]
        brace = head.find("{")
        if brace < 0:
            continue
        head = ATTRIBUTE.sub("", head[:brace])
        names = re.findall(r"[A-Za-z_]\w*", head[:head.find("(")])
        return names[-1] if names else None
    return None


def assert_problems():
    """Lines about functions of alloc/ that assert a lock their name and
    first comment line do not name (the lock rule, from the sources)."""
    out = []
    folder = os.path.join(REPO, "alloc")
    if not os.path.isdir(folder):
        return out
    for name in sorted(os.listdir(folder)):
        if not name.endswith((".c", ".h")):
            continue
        path = os.path.join(folder, name)
        with open(path, errors="replace") as f:
            text = f.read()
        for m in re.finditer(r"^[ \t]+XS_ASSERT_(PAIR_)?LOCKED\(", text,
                             re.M):
            fn = enclosing_function(text, m.start())
            if fn is None:
                continue
            pair = m.group(1) is not None
            first = first_comment_line(path, fn).lower()
            if fn.endswith("_locked") or "every lock" in first:
                continue
            if pair and (fn.endswith("_pair") or
                         fn.startswith(("xs_pair_", "xs_park_")) or
                         "lock" in first):
                continue
            what = "its pair's lock" if pair else "every lock"
            out.append(f"lock rule: alloc/{name} {fn} asserts {what}: name "
                       f"it or say so on its first comment line")
    return out


def lock_problems(objs):
    """Lines about functions that call a `_locked` function without
    holding every lock by their name, their act or their first comment."""
    out = []
    for src, obj in sorted(objs.items()):
        for fn, callees in sorted(calls(obj).items()):
            needed = sorted(c for c in callees
                            if c.endswith("_locked") and c != fn)
            if not needed or fn.endswith("_locked") or fn in LOCK_TAKERS or \
                    callees & LOCK_TAKERS:
                continue
            comment = first_comment_line(os.path.join(REPO, src), fn)
            if "every lock" in comment.lower():
                continue
            out.append(f"lock rule: {src} {fn} calls {' '.join(needed)}: "
                       f"name it _locked, take every lock, or say \"every "
                       f"lock\" on its first comment line")
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    global REPO
    build = argv[1]
    if "--repo" in argv:
        REPO = argv[argv.index("--repo") + 1]
    objs = objects(build)
    if not objs:
        print(f"layers.py: no object of the library under {build}",
              file=sys.stderr)
        return 2
    edges = graph(objs)
    bad = 0
    for src in sorted(objs):
        if src.startswith("alloc/") and room_of(src) is None:
            print(f"{src}: in no room of alloc/ (tools/layers.py, ALLOC_ROOMS)")
            bad += 1
    if "--graph" in argv:
        for src in sorted(edges):
            for dst in sorted(edges[src]):
                print(f"{src} -> {dst}: {' '.join(edges[src][dst])}")
    for src in sorted(edges):
        for dst in sorted(edges[src]):
            if rank(dst) > rank(src):
                print(f"upward call: {src} -> {dst}: "
                      f"{' '.join(edges[src][dst])}")
                bad += 1
    for line in include_problems():
        print(line)
        bad += 1
    for line in lock_problems(objs) + assert_problems():
        print(line)
        bad += 1
    for comp in circles(objs.keys(), edges):
        print("circle: " + " ".join(comp))
        members = set(comp)
        for src in comp:
            for dst in sorted(edges[src]):
                if dst in members:
                    print(f"  {src} -> {dst}: {' '.join(edges[src][dst])}")
        bad += 1
    n_edges = sum(len(d) for d in edges.values())
    print(f"layers.py: {len(objs)} files, {n_edges} edges, "
          f"{bad} problem{'s' if bad != 1 else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
