#!/usr/bin/env bash
# gpu-check.sh: the whole check on a machine with a GPU, in one command.
#
# Builds the tests against the real driver (-DXSEG_TEST_DRIVER=system), runs
# them one at a time (-j1: every test uses the one GPU, and a test that
# holds a stream must not wait behind another process's work), runs the
# benchmarks on the real driver (xseg-bench --driver cuda, then micro), and
# prints a short summary: passed / failed / timed out / skipped counts, and
# the skipped tests grouped by the reason they give. Exit status 0 only when
# no test failed or timed out and both benchmarks ran.
#
#   tools/gpu-check.sh                  build into build-gpu, test, bench
#   tools/gpu-check.sh --driver sim     the same on the emulator, the tests
#                                       told it is a real driver (a dry run,
#                                       -DXSEG_TEST_DRIVER=sim-as-system,
#                                       into build-gpu-sim)
#   tools/gpu-check.sh --summarize LOG  only the summary of a ctest -V log
#   tools/gpu-check.sh --no-build --build DIR
#                                       test and bench a tree built on
#                                       another machine with the same
#                                       configure line (the GPU machine
#                                       then needs no compiler, gtest or
#                                       headers; ctest's files name the
#                                       build's absolute paths)
#
# Options: --build DIR (build folder), --jobs N (compile jobs; tests always
# run one at a time), --no-bench, --micro-args "ARGS" (extra arguments for
# xseg-bench micro, e.g. "--pairs 20000 --rounds 1").
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
driver=cuda
build=""
jobs="$(nproc 2>/dev/null || echo 2)"
bench=1
build_tree=1
micro_args=""
summarize=""

usage() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
  exit "${1:-0}"
}

while [ $# -gt 0 ]; do
  case "$1" in
    --driver) driver="${2:?--driver needs cuda or sim}"; shift 2 ;;
    --build) build="${2:?--build needs a folder}"; shift 2 ;;
    --jobs) jobs="${2:?--jobs needs a number}"; shift 2 ;;
    --no-bench) bench=0; shift ;;
    --no-build) build_tree=0; shift ;;
    --micro-args) micro_args="${2?--micro-args needs a value}"; shift 2 ;;
    --summarize) summarize="${2:?--summarize needs a log}"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "gpu-check.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done

# Counts from the "N/M Test #K: name .... Status" lines; skip reasons from
# the tests' own output in a ctest -V log ("K: ...: Skipped" is followed by
# "K: <reason> (file:line)").
summarize_log() {
  awk '
    /^ *[0-9]+\/[0-9]+ +Test +#[0-9]+: / {
      name = $0; sub(/^ *[0-9]+\/[0-9]+ +Test +#[0-9]+: /, "", name)
      sub(/ .*/, "", name)
      # "Not Run" is a test that could not start (its program or
      # interpreter missing): a failure, not a skip.
      if ($0 ~ /\*\*\*Skipped|Disabled/) skipped++
      else if ($0 ~ /\*\*\*Timeout/) {
        timeout++; bad[++nbad] = name " (timeout)"
      }
      else if ($0 ~ / Passed /) passed++
      else {
        st = $0; sub(/.*\*\*\*/, "", st); sub(/ +[0-9.]+ sec.*/, "", st)
        failed++; bad[++nbad] = name " (" st ")"
      }
      total++
      next
    }
    /^[0-9]+: .*: Skipped$/ { want[$1] = 1; next }
    ($1 in want) {
      why = $0; sub(/^[0-9]+: /, "", why); sub(/ \([^()]*:[0-9]+\)$/, "", why)
      reasons[why]++; delete want[$1]
    }
    END {
      printf "tests: %d run: %d passed, %d failed, %d timed out, %d skipped\n",
             total, passed, failed, timeout, skipped
      n = 0
      for (r in reasons) n++
      if (n > 0) {
        print "skipped, by reason:"
        for (r in reasons) printf "  %4d  %s\n", reasons[r], r | "sort -rn"
        close("sort -rn")
      }
      if (nbad > 0) {
        print "failed or timed out:"
        for (i = 1; i <= nbad; i++) print "  " bad[i]
      }
      exit (failed + timeout > 0 || total == 0) ? 1 : 0
    }' "$1"
}

if [ -n "$summarize" ]; then
  summarize_log "$summarize"
  exit $?
fi

case "$driver" in
  cuda) test_driver=system; build="${build:-$root/build-gpu}" ;;
  sim) test_driver=sim-as-system; build="${build:-$root/build-gpu-sim}" ;;
  *) echo "gpu-check.sh: --driver is cuda or sim, not $driver" >&2; exit 2 ;;
esac

if [ "$driver" = cuda ] && command -v nvidia-smi >/dev/null 2>&1; then
  echo "== GPU"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used \
             --format=csv,noheader || true
fi

if [ "$build_tree" = 1 ]; then
  echo "== build ($build, tests against the $test_driver driver)"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
        -DXSEG_BUILD_TESTS=ON -DXSEG_TEST_DRIVER="$test_driver"
  cmake --build "$build" -j"$jobs"
elif [ ! -f "$build/CTestTestfile.cmake" ]; then
  echo "gpu-check.sh: --no-build needs a built tree in $build" >&2
  exit 2
fi

log="$build/gpu-check-ctest.log"
echo "== tests, one at a time (full output: $log)"
test_rc=0
ctest --test-dir "$build" -j1 -V >"$log" 2>&1 || test_rc=$?
grep -E '^ *[0-9]+/[0-9]+ +Test +#' "$log" | grep -v ' Passed ' || true

bench_rc=0
if [ "$bench" = 1 ]; then
  xb="$build/bench/xseg-bench"
  echo "== xseg-bench --driver $driver (every trace, every mode)"
  (cd "$root" && "$xb" --driver "$driver") || bench_rc=$?
  echo "== xseg-bench micro --driver $driver"
  # shellcheck disable=SC2086  # micro_args is a list of options
  (cd "$root" && "$xb" micro --driver "$driver" $micro_args) || bench_rc=$?
fi

echo "== summary ($driver driver)"
summary_rc=0
summarize_log "$log" || summary_rc=$?
if [ "$bench" = 1 ]; then
  if [ "$bench_rc" = 0 ]; then echo "bench: both runs finished"
  else echo "bench: failed (exit status $bench_rc)"; fi
fi
[ "$test_rc" = 0 ] && [ "$summary_rc" = 0 ] && [ "$bench_rc" = 0 ]
