#!/usr/bin/env bash
# gpu-session.sh: every check a lent GPU is for, in one run with a time
# limit per step, for a machine held a few minutes: the suite on the real
# driver (gpu-check.sh --no-build), PyTorch's checks and PyTorch's
# allocators beside xseg on live models (torch-check.py), xseg-bench and
# micro on the real driver, and two-thread scaling (bench/threads.sh).
# Each step writes into OUT as it goes, so a run stopped early still leaves
# what it measured; a step that fails does not stop the next.
#
#   tools/gpu-session.sh BUILD OUT
#
# BUILD: a tree configured as gpu-check.sh configures it
# (-DCMAKE_BUILD_TYPE=Release -DXSEG_BUILD_TESTS=ON
# -DXSEG_TEST_DRIVER=system) and built, here or on a machine without a
# GPU at the same absolute path (README.md: build with
# LD_LIBRARY_PATH=BUILD/sim there; checked first). OUT: a folder for its
# eight files (a device tool returns at most eight): session.txt (this
# script's own log, the machine included), gpu-check.txt, ctest.log,
# torch.txt, torch.json, bench.txt, micro.txt and threads.txt (free, then
# pinned). PyTorch's step runs torch-check.py --quick on gpt2-prefill and
# resnet50-train, 50 s a worker: the whole of it (every model, full
# length) takes longer than a lent machine's minutes (docs/h200/).
#
# Limits in seconds, from the environment: XSEG_CAP_TESTS (170),
# XSEG_CAP_TORCH (180), XSEG_CAP_BENCH (60), XSEG_CAP_MICRO (35),
# XSEG_CAP_THREADS (30, each of the two sets of six runs), with 5 s more
# for each step to be killed and 20 s for the machine's description: 555
# at most, under a device command's 600. The exit status is 0 when every
# step finished within its limit and passed.
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
[ -f "$build/CTestTestfile.cmake" ] || {
  echo "gpu-session.sh: $build is no built tree" >&2; exit 2; }
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 2
# The tree names its sources by absolute path: built elsewhere, its tests
# would find nothing ("0 run"), so say so at once.
built_from=$(sed -n 's/^# Source directory: //p' "$build/CTestTestfile.cmake")
[ "$built_from" = "$root" ] || {
  echo "gpu-session.sh: $build was built from $built_from, not $root" >&2
  exit 2; }
# Everything below also goes to session.txt: the step lines and summaries
# would otherwise live only in a device tool's output tail.
exec > >(tee "$out/session.txt") 2>&1

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
uname -a; nproc; date -u
timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used \
  --format=csv,noheader 2>&1
timeout 20 python3 -c 'import sys, torch; print(sys.version.split()[0],
                                    torch.__version__, torch.version.cuda)' 2>&1

step "the suite on the real driver (gpu-check.sh --no-build)"
capped "${XSEG_CAP_TESTS:-170}" tools/gpu-check.sh --no-build --build "$build" \
  --no-bench > "$out/gpu-check.txt" 2>&1
# A test a stopped ctest left running would hold the GPU for the next step.
pkill -9 -f "$build/tests/" 2>/dev/null
cp "$build/gpu-check-ctest.log" "$out/ctest.log" 2>/dev/null &&
  tools/gpu-check.sh --summarize "$out/ctest.log"

step "PyTorch: checks, torch.multiprocessing, live models (torch-check.py)"
XSEG_LIBRARY="$build/libxseg.so.0" \
XSEG_TORCH_LIBRARY="$build/torch_adapter/libxseg_torch.so.0" \
PYTHONPATH="$root/python" PYTHONUNBUFFERED=1 \
  capped "${XSEG_CAP_TORCH:-180}" python3 tools/torch-check.py --quick \
  --workloads gpt2-prefill resnet50-train --timeout 50 \
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

# Six runs of about 3.4 s each (a second's wait, then 2M pairs: ten took
# 57 s at 4M pairs on an H200's host, docs/h200/threads.txt).
step "two threads, six runs (bench/threads.sh)"
XSEG_THREADS_WAIT=1 capped "${XSEG_CAP_THREADS:-30}" bench/threads.sh \
  "$build/bench/xseg-bench" 6 -- --driver cuda --pairs 2000000 \
  > "$out/threads.txt" 2>&1
tail -3 "$out/threads.txt"

# Each worker on a core of its own: tells two threads on one core's
# hardware threads from what the allocator shares (bench/README.md).
step "two threads, six runs, pinned to cores (bench/threads.sh -- --pin)"
echo "== pinned (--pin)" >> "$out/threads.txt"
XSEG_THREADS_WAIT=1 capped "${XSEG_CAP_THREADS:-30}" bench/threads.sh \
  "$build/bench/xseg-bench" 6 -- --driver cuda --pairs 2000000 --pin \
  >> "$out/threads.txt" 2>&1
tail -3 "$out/threads.txt"

step "done: $([ "$failed" = 0 ] && echo "every step passed" ||
              echo "a step failed or ran out of time")"
exit "$failed"
