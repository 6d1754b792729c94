#!/usr/bin/env bash
# tests/check_summary.sh LOG... - the summary of `make check`: each log is a test program's
# (or a fuzz corpus replay's) output followed by an "exit N" line (see the Makefile). A
# program's checks count one by one (its "RESULT name passed failed" line); a missing log
# (it did not build), a missing RESULT line or a non-zero exit counts as one failure more.
# The last line is "N passed, N failed"; the exit status is 1 when anything failed.
passed=0 failed=0
for log in "$@"; do
  name=$(basename "$log" .log)
  if [ ! -f "$log" ]; then
    failed=$((failed + 1)); echo "  FAIL  $name (not built)"; continue
  fi
  rc=$(sed -n 's/^exit \([0-9]*\)$/\1/p' "$log" | tail -n 1)
  line=$(grep '^RESULT ' "$log" | tail -n 1)
  if [ -z "$line" ]; then
    failed=$((failed + 1)); echo "  FAIL  $name (no RESULT line, exit ${rc:-?})"; grep -v '^exit ' "$log" | tail -n 20; continue
  fi
  set -- $line
  passed=$((passed + $3)); failed=$((failed + $4))
  if [ "$4" != 0 ] || [ "$rc" != 0 ]; then
    [ "$4" = 0 ] && failed=$((failed + 1))
    echo "  FAIL  $name: $3 passed, $4 failed, exit $rc"; grep -v '^RESULT \|^exit ' "$log" | tail -n 20
  else
    echo "  ok    $name: $3 checks"
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
