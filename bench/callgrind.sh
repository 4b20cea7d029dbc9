#!/usr/bin/env bash
# callgrind.sh: instructions per cached malloc+free pair, counted by
# valgrind's callgrind (time on a shared machine is noise; instructions are
# not).
#
#   bench/callgrind.sh [XSEG_BENCH] [repeat | repeat-beside K | layers |
#                      random LIVE | mixed LIVE | mixed-small LIVE |
#                      mixed-large LIVE | deferred] [N1 N2]
#
# XSEG_BENCH defaults to build/bench/xseg-bench. "repeat" (the default)
# counts `xseg-bench micro --only cached-repeat` (one size, malloc then
# free); "repeat-beside K" the same with the pools of K other streams in
# the allocator (`--other-streams K`, as beside a server's other workers);
# "layers" counts `--only cached-layers` (a batch of 8 tensor sizes in both
# pools, allocated then freed in reverse order, a pair per tensor);
# "random LIVE" counts `--only cached-random` with LIVE blocks live
# and random sizes (1..4096 B); "mixed LIVE" `--only cached-mixed` the same
# with sizes over both pools (1 KiB .. 2 MiB), "mixed-small" and
# "mixed-large" with those of one pool alone (`--mixed-pools`);
# "deferred" counts `--only deferred`, whose every pair is a plain
# malloc+free of 4 KiB and a malloc, xseg_record_stream on a second
# stream and free (the free deferred behind an event), and also prints the
# count without the driver's own instructions (the inclusive cost of every
# cu* call, the emulator's here), which is the allocator's share. The
# emulator's stream thread decides whether a free's event has fired by the
# next malloc, so the deferred counts move by a few percent between runs.
# Each runs twice, with N1 and N2 pairs (default 20000 and 60000), one
# round each. Only instructions executed inside xseg_malloc and xseg_free
# (and xseg_record_stream) are collected (--toggle-collect, inclusive of
# what they call),
# so glibc's baseline loop is not counted; and the totals' difference
# divided by N2 - N1 removes what both runs share (filling the live set,
# the first pair that maps a granule), leaving the steady-state cost of one
# pair. The final drain of the live set is not counted: callgrind dumps
# its count before the bench's churn_drain (--dump-before) and only that
# dump is read, so each run counts the fill and the churn loop alone (a
# drain after 3x the churn costs more, which used to show as per-pair cost
# growing with the live set). The emulated device is made 4 GiB: valgrind
# cannot map the address space the allocator reserves for the default
# 80 GiB.
set -euo pipefail

bench=${1:-build/bench/xseg-bench}
case=${2:-repeat}
shift $(( $# > 2 ? 2 : $# ))
toggles=(--toggle-collect=xseg_malloc --toggle-collect=xseg_free)
if [ "$case" = random ]; then
  live=${1:?"random needs LIVE, e.g. random 10000"}
  shift
  args=(--only cached-random --live-min "$live" --live-max "$live")
elif [ "$case" = mixed ] || [ "$case" = mixed-small ] ||
     [ "$case" = mixed-large ]; then
  live=${1:?"$case needs LIVE, e.g. $case 10000"}
  shift
  pools=${case#mixed-}
  [ "$pools" = mixed ] && pools=both
  args=(--only cached-mixed --mixed-live "$live" --mixed-pools "$pools")
elif [ "$case" = layers ]; then
  args=(--only cached-layers)
elif [ "$case" = repeat-beside ]; then
  others=${1:?"repeat-beside needs K, e.g. repeat-beside 1"}
  shift
  args=(--only cached-repeat --other-streams "$others")
elif [ "$case" = deferred ]; then
  args=(--only deferred --fired)
  toggles+=(--toggle-collect=xseg_record_stream)
else
  args=(--only cached-repeat)
fi
n1=${1:-20000}
n2=${2:-60000}

command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind not found" >&2; exit 1; }
[ -x "$bench" ] || { echo "callgrind.sh: $bench is not built" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Total instructions collected in one run with $1 pairs, up to the drain
# (the dump written before churn_drain, out.N.1; "repeat" has no drain and
# writes only out.N).
count() {
  valgrind --tool=callgrind --callgrind-out-file="$tmp/out.$1" \
    "${toggles[@]}" --dump-before=churn_drain \
    "$bench" micro "${args[@]}" --pairs "$1" --rounds 1 \
    --device-memory 4G >/dev/null 2>"$tmp/log.$1" ||
    { cat "$tmp/log.$1" >&2; exit 1; }
  local out="$tmp/out.$1"
  if [ "$case" = random ] || [ "${case%%-*}" = mixed ]; then
    out="$tmp/out.$1.1"
    [ -f "$out" ] || { echo "callgrind.sh: no dump before churn_drain" \
                            "(is $bench built with symbols?)" >&2; exit 1; }
  fi
  awk '/^(summary|totals):/ { print $2; exit }' "$out"
}

# The inclusive cost of the driver's entry points in run $1's output.
driver_count() {
  callgrind_annotate --inclusive=yes --auto=no --threshold=100 "$tmp/out.$1" 2>/dev/null |
    awk '$0 ~ /:cu[A-Z][A-Za-z0-9_]* \[.*libcuda/ { gsub(",", "", $1); n += $1 }
         END { print n + 0 }'
}

i1=$(count "$n1")
i2=$(count "$n2")
per_pair=$(awk -v a="$i1" -v b="$i2" -v n1="$n1" -v n2="$n2" \
  'BEGIN { printf "%.1f", (b - a) / (n2 - n1) }')
if [ "$case" = deferred ]; then
  d1=$(driver_count "$n1")
  d2=$(driver_count "$n2")
  own=$(awk -v a="$i1" -v b="$i2" -v c="$d1" -v d="$d2" -v n1="$n1" \
    -v n2="$n2" 'BEGIN { printf "%.1f", ((b - d) - (a - c)) / (n2 - n1) }')
  echo "deferred: $per_pair instructions per plain pair + deferred" \
       "malloc/record_stream/free, $own without the driver's" \
       "($i1 instructions for $n1, $i2 for $n2; driver $d1, $d2)"
  exit 0
fi
echo "$case${live:+ (live $live)}${others:+ (other streams $others)}:" \
     "$per_pair instructions per malloc+free pair" \
     "($i1 instructions for $n1 pairs, $i2 for $n2)"
