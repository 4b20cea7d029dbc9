#!/usr/bin/env bash
# threads.sh: the two-thread scaling of the cached path, measured as the
# target of bench/README.md ("The cached path and threads") states it: the
# median and the minimum over N runs of `xseg-bench micro --only threads`,
# xseg's ratio (2 threads on 2 streams over 1 thread) beside glibc's own
# (each thread its own malloc+free loop, run in the same moments), so that
# xseg's means something on any machine.
#
#   bench/threads.sh [XSEG_BENCH] [N] [-- MICRO_ARGS...]
#
# XSEG_BENCH defaults to build/bench/xseg-bench (build it Release or
# RelWithDebInfo: a Debug build's asserts are not the cached path);
# N defaults to 10. MICRO_ARGS go to `micro` after `--only threads`
# (e.g. `--pairs 2000000` for longer runs, `--pin` for each worker on a
# core of its own). Prints the load (uptime) before
# and after, one line per run, then the medians and minima. The exit status
# is micro's failure, never the ratios': they are measurements, not tests.
#
# On a machine shared with other jobs a run is worth little while they use
# the cores, so each run waits (at most XSEG_THREADS_WAIT seconds, 60
# unless set; 0: no wait) for a second in which the cores were at least
# 95% idle (from /proc/stat), and its line says how busy that second was.
set -euo pipefail

bench=build/bench/xseg-bench
runs=10
if [ $# -gt 0 ] && [ "$1" != -- ]; then bench=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" != -- ]; then runs=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" = -- ]; then shift; fi
[ -x "$bench" ] || { echo "threads.sh: $bench is not an executable" >&2; exit 2; }
case $runs in ''|*[!0-9]*|0) echo "threads.sh: N must be a positive count" >&2; exit 2;; esac

# Percent of the cores busy over one second (-1 without /proc/stat).
busy_second() {
  [ -r /proc/stat ] || { sleep 1; echo -1; return; }
  local a b
  read -r _ u0 n0 s0 i0 w0 q0 sq0 st0 _ < /proc/stat
  sleep 1
  read -r _ u1 n1 s1 i1 w1 q1 sq1 st1 _ < /proc/stat
  a=$(( (i1 + w1) - (i0 + w0) ))
  b=$(( (u1 + n1 + s1 + i1 + w1 + q1 + sq1 + st1) -
        (u0 + n0 + s0 + i0 + w0 + q0 + sq0 + st0) ))
  echo $(( b > 0 ? 100 - 100 * a / b : -1 ))
}
wait_max=${XSEG_THREADS_WAIT:-60}

echo "load before: $(uptime)"
xs=() gl=()
for ((i = 1; i <= runs; i++)); do
  busy=-1
  for ((waited = 0; waited < wait_max; waited++)); do
    busy=$(busy_second)
    [ "$busy" -le 5 ] && break
  done
  # micro's stderr stays: a failed run says why (set -e then stops here).
  json=$("$bench" micro --only threads "$@" --json -)
  read -r x g one shared < <(jq -r '.threads |
      "\(.speedup_2) \(.glibc_speedup_2) \(.threads_1_pairs_per_s) \(.threads_2_shared_a_core or .glibc_threads_2_shared_a_core)"' <<<"$json")
  if [ "$x" = null ]; then
    echo "threads.sh: fewer than 2 cores: no two-thread ratio" >&2
    exit 2
  fi
  # "one core": two threads of the best run were one core's hardware
  # threads (micro_threads.c); `-- --pin` keeps them apart.
  printf 'run %2d: xseg %.3fx  glibc %.3fx  (1 thread %.1f M/s; busy %s%%%s)\n' \
    "$i" "$x" "$g" "$(jq -n "$one / 1e6")" "$busy" \
    "$([ "$shared" = true ] && echo '; one core')"
  xs+=("$x") gl+=("$g")
done
echo "load after:  $(uptime)"

# Median (the mean of the middle two for an even count) and minimum.
summary() {
  printf '%s\n' "$@" | sort -g | awk '
    { v[NR] = $1 }
    END {
      m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf "median %.3fx  min %.3fx", m, v[1]
    }'
}
echo "xseg  over $runs runs: $(summary "${xs[@]}")"
echo "glibc over $runs runs: $(summary "${gl[@]}")"
