#!/usr/bin/env bash
# gpu-session.sh: every check a lent GPU is for, in one run with a time
# limit per step, for a machine held a few minutes: the suite on the real
# driver (gpu-check.sh --no-build), PyTorch's checks and PyTorch's
# allocators beside xseg on live models (torch-check.py), xseg-bench and
# micro on the real driver, and two-thread scaling (bench/threads.sh).
# Each step writes into OUT as it goes, so a run stopped early still leaves
# what it measured; a step that fails does not stop the next.
#
#   tools/gpu-session.sh BUILD OUT [--quick]
#
# BUILD: a tree configured as gpu-check.sh configures it
# (-DCMAKE_BUILD_TYPE=Release -DXSEG_BUILD_TESTS=ON
# -DXSEG_TEST_DRIVER=system) and built, here or on a machine without a
# GPU at the same absolute path (README.md: build with
# LD_LIBRARY_PATH=BUILD/sim there). OUT: a folder for env.txt,
# gpu-check.txt, ctest.log, torch.txt, torch.json, bench.txt, micro.txt,
# threads.txt and threads-pinned.txt. --quick: torch-check.py --quick
# (warm-up-heavy rates).
#
# Limits in seconds, from the environment: XSEG_CAP_TESTS (180),
# XSEG_CAP_TORCH (230), XSEG_CAP_BENCH (60), XSEG_CAP_MICRO (35),
# XSEG_CAP_THREADS (30), XSEG_CAP_THREADS_PINNED (30): 565 in all. The exit status is 0 when every step
# finished within its limit and passed.
set -uo pipefail

usage() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
  exit "${1:-0}"
}

[ $# -ge 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; } && usage 0
[ $# -ge 2 ] || usage 2
build="$(cd "$1" 2>/dev/null && pwd)" || {
  echo "gpu-session.sh: no build folder $1" >&2; exit 2; }
out="$2"
quick=""
[ "${3:-}" = --quick ] && quick=--quick
[ -f "$build/CTestTestfile.cmake" ] || {
  echo "gpu-session.sh: $build is no built tree" >&2; exit 2; }
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 2

start=$(date +%s)
failed=0
step() { echo "== [$(( $(date +%s) - start )) s] $*"; }
# Runs "$@" under a limit of $1 seconds; a step over its limit or failing
# marks the session failed.
capped() {
  local cap=$1; shift
  timeout -k 5 "$cap" "$@"
  local rc=$?
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "(stopped at its limit, ${cap} s)"
  [ "$rc" = 0 ] || failed=1
  return "$rc"
}

step "machine"
{
  uname -a; nproc; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used \
             --format=csv,noheader 2>&1
  python3 -c 'import sys, torch; print(sys.version.split()[0],
                                      torch.__version__, torch.version.cuda)' 2>&1
} | tee "$out/env.txt"

step "the suite on the real driver (gpu-check.sh --no-build)"
capped "${XSEG_CAP_TESTS:-180}" tools/gpu-check.sh --no-build --build "$build" \
  --no-bench > "$out/gpu-check.txt" 2>&1
# A test a stopped ctest left running would hold the GPU for the next step.
pkill -9 -f "$build/tests/" 2>/dev/null
cp "$build/gpu-check-ctest.log" "$out/ctest.log" 2>/dev/null &&
  tools/gpu-check.sh --summarize "$out/ctest.log"

step "PyTorch: checks, torch.multiprocessing, live models (torch-check.py)"
XSEG_LIBRARY="$build/libxseg.so.0" \
XSEG_TORCH_LIBRARY="$build/torch_adapter/libxseg_torch.so.0" \
PYTHONPATH="$root/python" PYTHONUNBUFFERED=1 \
  capped "${XSEG_CAP_TORCH:-230}" python3 tools/torch-check.py $quick \
  --json "$out/torch.json" > "$out/torch.txt" 2>&1
pkill -9 -f tools/torch 2>/dev/null
cat "$out/torch.txt"

step "xseg-bench --driver cuda (every trace, every mode the driver allows)"
capped "${XSEG_CAP_BENCH:-60}" "$build/bench/xseg-bench" --driver cuda \
  --quiet > "$out/bench.txt" 2>&1
cat "$out/bench.txt"

step "xseg-bench micro --driver cuda"
capped "${XSEG_CAP_MICRO:-35}" "$build/bench/xseg-bench" micro --driver cuda \
  > "$out/micro.txt" 2>&1
cat "$out/micro.txt"

step "two threads, ten runs (bench/threads.sh)"
XSEG_THREADS_WAIT=1 capped "${XSEG_CAP_THREADS:-30}" bench/threads.sh \
  "$build/bench/xseg-bench" 10 -- --driver cuda --pairs 2000000 \
  > "$out/threads.txt" 2>&1
tail -3 "$out/threads.txt"

# Each worker on a core of its own: tells two threads on one core's
# hardware threads from what the allocator shares (bench/README.md).
step "two threads, ten runs, pinned to cores (bench/threads.sh -- --pin)"
XSEG_THREADS_WAIT=1 capped "${XSEG_CAP_THREADS_PINNED:-30}" bench/threads.sh \
  "$build/bench/xseg-bench" 10 -- --driver cuda --pairs 2000000 --pin \
  > "$out/threads-pinned.txt" 2>&1
tail -3 "$out/threads-pinned.txt"

step "done: $([ "$failed" = 0 ] && echo "every step passed" ||
              echo "a step failed or ran out of time")"
exit "$failed"
