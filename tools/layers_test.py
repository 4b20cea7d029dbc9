#!/usr/bin/env python3
"""layers_test.py: tools/layers.py fails where it must.

Builds a small tree of objects laid out as CMake lays out the library's
(BUILD/CMakeFiles/xseg_<layer>.dir/<layer>/<file>.c.o) with one call up
the layers (vmm -> segments), one circle between two files of alloc/, one
call up alloc/'s rooms (base -> entry), one file of alloc/ in no room,
one include of a higher room's header (pairs -> growth), one function
that calls a `_locked` function without every lock by its name, its act
or its first comment line, and two that assert a lock (every lock, a
pair's) that neither their names nor their first comment lines name, and
checks that layers.py reports each one and fails; then that a clean
tree passes. Usage: tools/layers_test.py [CC]
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CC = sys.argv[1] if len(sys.argv) > 1 else "cc"

ASSERTS = ("#define XS_ASSERT_LOCKED(a) (void)(a)\n"
           "#define XS_ASSERT_PAIR_LOCKED(a, p) (void)(a)\n")
BAD = {
    "vmm/low.c": "int seg_high(void); int vmm_low(void) { return seg_high(); }",
    "segments/high.c": "int seg_high(void) { return 1; }",
    "alloc/pairs.c": "int circ_b(void); int circ_a(void) { return circ_b(); }",
    "alloc/enter.c": "int circ_a(void); int circ_b(void) { return circ_a(); }",
    "alloc/thread.c": "int entry_top(void); int base_low(void) { return entry_top(); }",
    "alloc/alloc.c": "int entry_top(void) { return 2; }",
    "alloc/nowhere.c": "int nowhere(void) { return 3; }",
    "alloc/ranges.c": '#include "alloc/grow.h"\nint ranges(void) { return 4; }',
    "alloc/grow.h": "",
    "alloc/grow.c": "int xs_g_locked(void);\n"
                    "/* A helper. */\n"
                    "int grow_helper(void) { return xs_g_locked(); }",
    "alloc/deferred.c": ASSERTS +
                        "/* A helper. */\n"
                        "static int deferred_all(int a) {\n"
                        "  XS_ASSERT_LOCKED(a);\n  return a;\n}\n"
                        "static __attribute__((noinline)) int\n"
                        "deferred_some(int a) {\n"
                        "  XS_ASSERT_PAIR_LOCKED(a, a);\n"
                        "  return deferred_all(a);\n}\n"
                        "int deferred_entry(int a) { return deferred_some(a); }",
}
GOOD = {
    "vmm/low.c": "int vmm_low(void) { return 1; }",
    "segments/high.c": "int vmm_low(void); int seg_high(void) { return vmm_low(); }",
    "alloc/thread.c": "int seg_high(void); int base_low(void) { return seg_high(); }",
    "alloc/alloc.c": "int base_low(void); int entry_top(void) { return base_low(); }",
    "alloc/grow.c": "int xs_g_locked(void) { return 0; }\n"
                    "int xs_alloc_enter(void);\n"
                    "/* Every lock held: a helper. */\n"
                    "int grow_helper(void) { return xs_g_locked(); }\n"
                    "int grow_named_locked(void) { return xs_g_locked(); }\n"
                    "int grow_entry(void) { xs_alloc_enter(); "
                    "return xs_g_locked(); }",
    "alloc/deferred.c": ASSERTS +
                        "int deferred_all_locked(int a) {\n"
                        "  XS_ASSERT_LOCKED(a);\n  return a;\n}\n"
                        "/* Every lock held: a helper. */\n"
                        "static __attribute__((noinline)) int\n"
                        "deferred_helper(int a) {\n"
                        "  XS_ASSERT_LOCKED(a);\n"
                        "  return deferred_all_locked(a);\n}\n"
                        "/* Pair lock held: another. */\n"
                        "static int deferred_some(int a) {\n"
                        "  XS_ASSERT_PAIR_LOCKED(a, a);\n  return a;\n}\n"
                        "int xs_pair_thing(int a) {\n"
                        "  XS_ASSERT_PAIR_LOCKED(a, a);\n"
                        "  return deferred_some(a);\n}\n"
                        "int deferred_entry_locked(int a) {\n"
                        "  return deferred_helper(a) + xs_pair_thing(a);\n}",
}


def run(tree):
    with tempfile.TemporaryDirectory() as top:
        repo, build = os.path.join(top, "repo"), os.path.join(top, "build")
        for path, text in tree.items():
            src = os.path.join(repo, path)
            os.makedirs(os.path.dirname(src), exist_ok=True)
            with open(src, "w") as f:
                f.write(text + "\n")
        for path in tree:
            if not path.endswith(".c"):
                continue
            src = os.path.join(repo, path)
            layer = path.split("/")[0]
            obj = os.path.join(build, "CMakeFiles", f"xseg_{layer}.dir",
                               path + ".o")
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            subprocess.run([CC, "-I", repo, "-c", src, "-o", obj], check=True)
        r = subprocess.run([sys.executable, os.path.join(HERE, "layers.py"),
                            build, "--repo", repo],
                           capture_output=True, text=True)
        return r.returncode, r.stdout


def main():
    failed = 0
    rc, out = run(BAD)
    print(out, end="")
    for want in ["upward call: vmm/low.c -> segments/high.c: seg_high",
                 "circle: alloc/enter.c alloc/pairs.c",
                 "upward call: alloc/thread.c -> alloc/alloc.c: entry_top",
                 "alloc/nowhere.c: in no room of alloc/",
                 "upward include: alloc/ranges.c (pairs) -> alloc/grow.h "
                 "(growth)",
                 "lock rule: alloc/grow.c grow_helper calls xs_g_locked",
                 "lock rule: alloc/deferred.c deferred_all asserts every "
                 "lock",
                 "lock rule: alloc/deferred.c deferred_some asserts its "
                 "pair's lock"]:
        if want not in out:
            print(f"layers_test: missing: {want}")
            failed += 1
    if rc != 1:
        print(f"layers_test: exit status {rc} on a bad tree, not 1")
        failed += 1
    rc, out = run(GOOD)
    print(out, end="")
    if rc != 0:
        print(f"layers_test: exit status {rc} on a clean tree, not 0")
        failed += 1
    print("layers_test:", "FAILED" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
