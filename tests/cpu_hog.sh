#!/usr/bin/env bash
# Usage: bash tests/cpu_hog.sh N -- COMMAND...
# Runs COMMAND beside N busy loops (one core's worth each), so that it meets a machine slower
# than this one; the loops end with it, whatever its exit status, which is this script's.
set -euo pipefail
n=$1
shift
[ "${1:-}" = "--" ] && shift
hogs=()
cleanup() { [ ${#hogs[@]} -eq 0 ] || kill "${hogs[@]}" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq "$n"); do
  python3 -c 'while True: pass' &
  hogs+=("$!")
done
"$@"
