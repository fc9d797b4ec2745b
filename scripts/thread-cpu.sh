#!/usr/bin/env bash
# CPU per thread of one process over an interval, from /proc/<pid>/task/*/stat (utime+stime,
# in clock ticks), grouped by thread name: what an idle or loaded venue spends where.
# Usage: scripts/thread-cpu.sh PID SECONDS
set -euo pipefail
pid=$1; secs=${2:-10}
hz=$(getconf CLK_TCK)
snap() {
  for t in /proc/"$pid"/task/*; do
    [ -r "$t/stat" ] || continue
    # Field 2 (comm) may hold spaces: cut at the last ')'.
    s=$(cat "$t/stat" 2>/dev/null) || continue
    name=${s#*(}; name=${name%)*}
    rest=${s##*) }
    set -- $rest
    echo "${t##*/} ${name// /_} $(( ${12} + ${13} ))"
  done
}
a=$(snap); sleep "$secs"; b=$(snap)
join <(echo "$a" | sort -k1,1) <(echo "$b" | sort -k1,1) |
  awk -v hz="$hz" -v s="$secs" '{d=$5-$3; n[$2]+=d; c[$2]++} END {
    for (k in n) { tot+=n[k]; printf "%-28s %3d threads %7.3f cores\n", k, c[k], n[k]/hz/s }
    printf "%-28s %3s         %7.3f cores\n", "TOTAL", "", tot/hz/s }' | sort -k4 -nr
