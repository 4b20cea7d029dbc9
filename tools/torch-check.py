#!/usr/bin/env python3
"""torch-check.py: proves xseg as PyTorch's allocator on a machine with a GPU
and torch, and compares it with PyTorch's own allocators. One command:

    PYTHONPATH=python python3 tools/torch-check.py [--quick] [--json FILE]

(the libraries are found beside python/ in a build tree, or from
XSEG_LIBRARY / XSEG_TORCH_LIBRARY, as python/xseg_torch.py finds them).

1. Correctness, with xseg installed (a subprocess of its own):
   record_stream       a producer writes, a held consumer stream reads; the
                       block is freed and the producer allocates and writes
                       at once: the consumer must read the producer's data
   cuda_graph          a graph captured with allocations inside, replayed
                       (result checked), destroyed: its pool's memory returns
   oom                 an impossible request raises at the call (its type and
                       message shown), in autograd's thread too; then the
                       program goes on
   stats               memory_allocated / max_ / reserved equal what was
                       allocated; reset_peak_memory_stats
   snapshot            _record_memory_history + _dump_snapshot, the pickle
                       opened by torch.cuda._memory_viz (segsum, trace,
                       trace_plot)
   mp_*                torch.multiprocessing through xseg's IPC
                       (tools/torch_check_mp.py): dtypes and views over an
                       mp.Queue, the producer deleting first, a consumer
                       killed, a relay to a third process; then the median
                       cost of sharing, opening and closing a 1 MiB tensor,
                       native against xseg, each in a process of its own
2. Side by side, each allocator in its own process (the allocator cannot
   change once CUDA is initialised): PyTorch native,
   expandable_segments:True, backend:cudaMallocAsync and xseg, on live
   variable-batch models: GPT-2 prefill and generation (transformers, from
   its config: no download) and ResNet-50 training (torchvision), or a small
   transformer when those packages are missing (tools/torch_check_models.py).
   Throughput, peak allocated, peak reserved, fragmentation (peak reserved /
   peak allocated) and a checksum of the outputs, which must be identical
   across allocators.

Exit status 0 when every check passed and every checksum agreed.
"""
import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

import torch_check_models   # tools/, beside this file

HERE = os.path.dirname(os.path.abspath(__file__))
ALLOCATORS = {  # name: PYTORCH_CUDA_ALLOC_CONF (None: xseg_torch.install())
    "native": "",
    "expandable": "expandable_segments:True",
    "cudaMallocAsync": "backend:cudaMallocAsync",
    "xseg": None,
}
MiB = 1 << 20


# ---- the parent: runs workers, prints tables ---------------------------------

def run_worker(allocator, task, quick, timeout):
    env = dict(os.environ)
    conf = ALLOCATORS[allocator]
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(HERE, "..", "python"), HERE] +
        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", allocator,
           task] + (["--quick"] if quick else [])
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        result = {"error": "exit %d: %s" % (
            done.returncode, (done.stderr or done.stdout)[-1500:])}
        for line in done.stdout.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
    except subprocess.TimeoutExpired:
        result = {"error": "timed out after %d s" % timeout}
    # One line as each worker ends, so that a run cut short still shows
    # what it measured (the tables come at the end).
    print("  %s under %s: %s (%.0f s)" % (task, allocator, summary(result),
                                         time.perf_counter() - start),
          flush=True)
    return result


def summary(result):
    """One worker's result in a few words."""
    if "error" in result:
        return "error: " + result["error"].strip().splitlines()[-1][:200] \
            if result["error"].strip() else "error"
    if "checks" in result:
        bad = [n for n, (ok, _) in result["checks"].items() if not ok]
        return "%d checks, failed: %s" % (len(result["checks"]),
                                          ", ".join(bad) or "none")
    if "rate" in result:
        return "%.1f %s, fragmentation %.3f" % (
            result["rate"], result.get("unit", ""), result["fragmentation"])
    return ", ".join("%s %s" % (k, v) for k, v in sorted(result.items())
                     if isinstance(v, (int, float)))


def format_table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows)
              for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in
                                      zip(r, widths)) + " |"
    out = [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    return "\n".join(out + [line(r) for r in rows])


def checks_table(result):
    rows = []
    for name, (ok, detail) in result.get("checks", {}).items():
        rows.append([name, "ok" if ok else "FAILED", detail])
    if "error" in result:
        rows.append(["(worker)", "FAILED", result["error"]])
    return rows


def bench_rows(results):
    """results: {workload: {allocator: result}} -> table rows, and the
    workloads whose checksums differ."""
    rows, mismatched = [], []
    for workload, by_alloc in results.items():
        sums = {a: r.get("checksum") for a, r in by_alloc.items()
                if "error" not in r}
        same = len(set(sums.values())) <= 1
        if not same:
            mismatched.append(workload)
        unit = next((r["unit"] for r in by_alloc.values() if "unit" in r), "")
        for metric in ("rate", "peak_allocated", "peak_reserved",
                       "fragmentation"):
            row = [workload if metric == "rate" else "",
                   metric + (" (%s)" % unit if metric == "rate" else "")]
            for a in ALLOCATORS:
                r = by_alloc.get(a, {"error": "not run"})
                if "error" in r:
                    row.append("error")
                elif metric.startswith("peak"):
                    row.append("%.0f MiB" % (r[metric] / MiB))
                elif metric == "fragmentation":
                    row.append("%.3f" % r[metric])
                else:
                    row.append("%.1f" % r[metric])
            rows.append(row)
        rows.append(["", "outputs", *["same" if same else
                                      str(sums.get(a))[:12]
                                      for a in ALLOCATORS]])
    return rows, mismatched


def parent(args):
    import torch   # the parent touches no CUDA memory: the workers do
    print("torch %s, %s" % (torch.__version__, describe_gpu(torch)))
    print("date %s" % time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    failed = False
    done = {}

    def save(key, value):
        """Every result so far into --json, after each worker: a run
        stopped at its time limit keeps what it measured."""
        done[key] = value
        if args.json:
            with open(args.json, "w") as f:
                json.dump(done, f, indent=1)

    checks = run_worker("xseg", "checks", args.quick, args.timeout)
    save("checks", checks)
    rows = checks_table(checks)
    print("\nCorrectness (xseg installed)\n" +
          format_table(["check", "result", "detail"], rows))
    failed |= any(r[1] != "ok" for r in rows)
    cost = {a: run_worker(a, "mp_cost", args.quick, args.timeout)
            for a in ("native", "xseg")}
    save("mp_cost", cost)
    print("\nSharing a 1 MiB CUDA tensor through torch.multiprocessing "
          "(median us)\n" + format_table(
              ["allocator", "share", "open", "close"],
              [[a, "error"] + [""] * 2 if "error" in c else
               [a] + ["%.1f" % c[k] for k in ("share_us", "open_us",
                                             "close_us")]
               for a, c in cost.items()]))
    for a, c in cost.items():
        if "error" in c:
            failed = True
            print("mp_cost under %s: %s" % (a, c["error"]))
    results = {}
    for workload in args.workloads:
        results[workload] = {}
        for a in ALLOCATORS:
            results[workload][a] = run_worker(a, "bench:" + workload,
                                              args.quick, args.timeout)
            save("bench", results)
    rows, mismatched = bench_rows(results)
    print("\nSide by side (one process per allocator and workload)\n" +
          format_table(["workload", "metric", *ALLOCATORS], rows))
    for workload, by_alloc in results.items():
        for a, r in by_alloc.items():
            if "error" in r:
                failed = True
                print("%s under %s: %s" % (workload, a, r["error"]))
            elif r.get("note"):
                print("%s: %s" % (workload, r["note"]))
    if mismatched:
        failed = True
        print("outputs differ between allocators: %s" % ", ".join(mismatched))
    print("\n%s" % ("FAILED" if failed else "all passed"))
    return 1 if failed else 0


def nvidia_smi(field):
    """One field of the first GPU from nvidia-smi (no CUDA initialised in
    the parent), or "?"."""
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=" + field, "--format=csv,noheader"],
            capture_output=True, text=True,
            timeout=30).stdout.splitlines()[0].strip()
    except (OSError, IndexError, subprocess.SubprocessError):
        return "?"


def describe_gpu(torch):
    if not torch.cuda.is_available():
        return "no GPU"
    return "%s, driver %s, CUDA %s" % (nvidia_smi("name"),
                                       nvidia_smi("driver_version"),
                                       torch.version.cuda)


# ---- the worker: one allocator, one task ---------------------------------------

def setup_allocator(name):
    if name == "xseg":
        import xseg_torch
        xseg_torch.install()
    import torch
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


def check(results, name, fn):
    try:
        detail = fn()
        results[name] = (True, detail or "")
    except Exception as err:   # a failed check is reported, not fatal
        results[name] = (False, "%s: %s" % (type(err).__name__,
                                            str(err).splitlines()[0][:200]))


def check_record_stream(torch):
    dev = torch.device("cuda")
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    n = 16 * MiB // 4
    # The kernels load first: a process's first launch of a kernel can wait
    # for its module long enough for the consumer's sleep to end before
    # the free (seen on an H200), and then reuse is right.
    warm = torch.full((n,), 1.0, device=dev) * 2
    torch.cuda._sleep(1)
    torch.cuda.synchronize()
    del warm
    for cycles in (1 << 30, 1 << 32):
        with torch.cuda.stream(producer):
            a = torch.full((n,), 1.0, device=dev)
        consumer.wait_stream(producer)
        with torch.cuda.stream(consumer):
            torch.cuda._sleep(cycles)       # the consumer is busy
            b = a * 2                       # ...then reads a
        a.record_stream(consumer)
        a_ptr = a.data_ptr()
        del a                               # freed while the consumer waits
        with torch.cuda.stream(producer):
            c = torch.full((n,), 7.0, device=dev)
        busy = not consumer.query()         # still busy after c's malloc
        c_ptr = c.data_ptr()
        torch.cuda.synchronize()
        if not bool((b == 2.0).all()):
            raise AssertionError("the consumer read overwritten data")
        if not busy:
            continue                        # no proof either way: again
        if c_ptr < a_ptr + 4 * n and a_ptr < c_ptr + 4 * n:
            raise AssertionError("reused the recorded block while the "
                                 "consumer still ran")
        return ("no reuse while the consumer ran (sleep of %d cycles); its "
                "data intact" % cycles)
    raise AssertionError("no proof: the consumer finished before the "
                         "producer's next malloc each time")


def check_cuda_graph(torch):
    dev = torch.device("cuda")
    lin = torch.nn.Linear(1024, 1024, device=dev)
    x = torch.randn(64, 1024, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            lin(x).relu().sum()
    torch.cuda.current_stream().wait_stream(side)
    before = torch.cuda.memory_reserved()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        h = lin(x)
        tmp = [torch.empty(8 * MiB, dtype=torch.uint8, device=dev)
               for _ in range(4)]
        y = (h.relu() * 2).sum(dim=1)
        del tmp
    with_graph = torch.cuda.memory_reserved()
    x.copy_(torch.randn(64, 1024, device=dev))
    g.replay()
    torch.cuda.synchronize()
    want = (lin(x).relu() * 2).sum(dim=1)
    if not torch.allclose(y, want, rtol=1e-4, atol=1e-3):
        raise AssertionError("replay computed something else")
    del g, y, h
    import gc
    gc.collect()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved()
    if after >= with_graph:
        raise AssertionError("reserved %d -> %d: the pool kept its memory" %
                             (with_graph, after))
    # A replay still queued (behind a sleep on the current stream, where
    # CUDAGraph::replay launches) when the graph goes: its reset releases
    # the pool without waiting, so empty_cache must wait for the device
    # before it unmaps the pool's memory.
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        z = torch.empty(16 * MiB, dtype=torch.uint8, device=dev).fill_(7)
    torch.cuda.synchronize()
    torch.cuda._sleep(1 << 31)
    g2.replay()
    del g2, z
    gc.collect()
    torch.cuda.empty_cache()
    if not torch.cuda.current_stream().query():
        raise AssertionError("empty_cache returned a released graph pool's "
                             "memory while a replay of the graph was queued")
    return ("reserved %.0f MiB before, %.0f with the graph, %.0f after; "
            "a queued replay waited for" % (
                before / MiB, with_graph / MiB, after / MiB))


def check_oom(torch):
    dev = torch.device("cuda")
    kinds = []
    try:
        torch.empty(1 << 46, dtype=torch.uint8, device=dev)
        raise AssertionError("64 TiB allocated")
    except RuntimeError as err:
        if not str(err).startswith("CUDA out of memory."):
            raise
        kinds.append(type(err).__name__)
        message = str(err).splitlines()[0]

    class Greedy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 1

        @staticmethod
        def backward(ctx, grad):
            return grad + torch.empty(1 << 46, dtype=torch.uint8,
                                      device=grad.device).sum()

    w = torch.ones(16, device=dev, requires_grad=True)
    try:
        Greedy.apply(w).sum().backward()
        raise AssertionError("64 TiB allocated in backward")
    except RuntimeError as err:
        if "CUDA out of memory." not in str(err):
            raise
        kinds.append(type(err).__name__ + " (backward)")
    z = torch.ones(1 << 20, device=dev) * 3       # the program goes on
    if float(z.sum()) != 3.0 * (1 << 20):
        raise AssertionError("wrong result after the OOM")
    return "%s; %s" % (", ".join(kinds), message[:120])


def check_stats(torch):
    dev = torch.device("cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t = torch.empty(10 * MiB, dtype=torch.uint8, device=dev)
    u = torch.empty(1000, dtype=torch.uint8, device=dev)
    got = torch.cuda.memory_allocated() - base
    want = 10 * MiB + 1024             # 1000 bytes round to 512-byte units
    if got != want:
        raise AssertionError("memory_allocated grew by %d, not %d" %
                             (got, want))
    if torch.cuda.max_memory_allocated() != base + want:
        raise AssertionError("max_memory_allocated %d" %
                             torch.cuda.max_memory_allocated())
    if torch.cuda.memory_reserved() < base + want:
        raise AssertionError("memory_reserved below allocated")
    stats = torch.cuda.memory_stats()
    if stats["allocation.all.current"] < 2:
        raise AssertionError("allocation.all.current %d" %
                             stats["allocation.all.current"])
    del t, u
    if torch.cuda.memory_allocated() != base:
        raise AssertionError("not back to %d after del" % base)
    torch.cuda.memory_summary()
    return "allocated +%d exactly; peak, reserved, summary agree" % want


def check_snapshot(torch):
    from torch.cuda import _memory_viz
    dev = torch.device("cuda")
    torch.cuda.memory._record_memory_history(max_entries=100000)
    keep = [torch.empty(s * MiB, dtype=torch.uint8, device=dev)
            for s in (1, 3, 7)]
    del keep[1]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "snapshot.pickle")
        torch.cuda.memory._dump_snapshot(path)
        with open(path, "rb") as f:
            snap = pickle.load(f)
    torch.cuda.memory._record_memory_history(enabled=None)
    summary = _memory_viz.segsum(snap)
    _memory_viz.trace(snap)
    html = _memory_viz.trace_plot(snap)
    actions = {e["action"] for d in snap["device_traces"] for e in d}
    if "alloc" not in actions:
        raise AssertionError("no alloc in the trace: %s" % actions)
    return "%d segments, %d trace entries; segsum: %s; viz %d bytes" % (
        len(snap["segments"]), sum(len(d) for d in snap["device_traces"]),
        summary.splitlines()[-7].strip() if summary else "", len(html))


def worker_checks(torch):
    results = {}
    torch.cuda.init()
    for name, fn in (("record_stream", check_record_stream),
                     ("cuda_graph", check_cuda_graph),
                     ("oom", check_oom), ("stats", check_stats),
                     ("snapshot", check_snapshot)):
        check(results, name, lambda: fn(torch))
    # torch.multiprocessing through xseg's IPC (tools/torch_check_mp.py):
    # dtypes and views over an mp.Queue, the producer deleting first, a
    # consumer killed, a relay to a third process.
    import torch_check_mp
    results.update(torch_check_mp.checks(torch))
    import xseg_torch
    check(results, "xseg_check", xseg_torch.check)
    return {"checks": results}


def worker_bench(torch, workload, quick):
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
    rate, unit, checksum, note = torch_check_models.WORKLOADS[workload](
        torch, quick)
    if rate is None:
        return {"error": note}
    stats = torch.cuda.memory_stats()
    peak_alloc = stats.get("allocated_bytes.all.peak", 0)
    peak_res = stats.get("reserved_bytes.all.peak", 0)
    return {"rate": rate, "unit": unit, "checksum": repr(checksum),
            "peak_allocated": peak_alloc, "peak_reserved": peak_res,
            "fragmentation": peak_res / peak_alloc if peak_alloc else 0.0,
            "note": note}


def worker(args):
    torch = setup_allocator(args.worker[0])
    task = args.worker[1]
    if task == "checks":
        result = worker_checks(torch)
    elif task == "mp_cost":
        import torch_check_mp
        torch.cuda.init()
        result = torch_check_mp.open_close_cost(torch)
    else:
        result = worker_bench(torch, task.split(":", 1)[1], args.quick)
    print("RESULT " + json.dumps(result), flush=True)


def self_test():
    """The parent's logic on canned worker results, without torch or a GPU
    (tests/CMakeLists.txt runs it): tables, failures, checksum agreement."""
    same = {a: {"rate": 100.0 + i, "unit": "tok/s", "checksum": "1.5",
                "peak_allocated": 100 * MiB, "peak_reserved": 110 * MiB,
                "fragmentation": 1.1} for i, a in enumerate(ALLOCATORS)}
    differ = {a: dict(r, checksum=repr(float(i)))
              for i, (a, r) in enumerate(same.items())}
    rows, bad = bench_rows({"same": same, "differ": differ})
    assert bad == ["differ"], bad
    assert rows[0][:3] == ["same", "rate (tok/s)", "100.0"], rows[0]
    assert rows[3][2] == "1.100" and rows[1][2] == "100 MiB", rows
    assert rows[4] == ["", "outputs"] + ["same"] * 4, rows[4]
    assert rows[9][2:] == ["0.0", "1.0", "2.0", "3.0"], rows[9]
    broken = dict(same, xseg={"error": "exit 1"})
    assert bench_rows({"w": broken})[0][0][5] == "error"
    checks = checks_table({"checks": {"a": (True, "fine"),
                                      "b": (False, "why")}})
    assert checks == [["a", "ok", "fine"], ["b", "FAILED", "why"]], checks
    assert summary({"error": "exit 1: a\nb"}) == "error: b"
    assert summary({"checks": {"a": (True, ""), "b": (False, "")}}
                   ) == "2 checks, failed: b"
    assert summary(same["xseg"]) == "103.0 tok/s, fragmentation 1.100"
    assert summary({"share_us": 1.5}) == "share_us 1.5"
    table = format_table(["x", "y"], [["1", "22"]])
    assert table.splitlines() == ["| x | y  |", "|---|----|", "| 1 | 22 |"]
    print("self-test passed")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="fewer iterations (a smoke test)")
    p.add_argument("--json", help="also write every result to this file")
    p.add_argument("--timeout", type=int, default=900,
                   help="seconds per worker process")
    p.add_argument("--workloads", nargs="+",
                   default=list(torch_check_models.WORKLOADS),
                   choices=list(torch_check_models.WORKLOADS))
    p.add_argument("--self-test", action="store_true",
                   help="check this script's own logic (no torch needed)")
    p.add_argument("--worker", nargs=2, metavar=("ALLOCATOR", "TASK"),
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.self_test:
        return self_test()
    if args.worker:
        return worker(args)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
