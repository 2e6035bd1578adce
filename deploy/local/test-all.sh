#!/usr/bin/env bash
# `make test`'s pytest part: the end-to-end tests on the real lab and everything else, side by side.
#
# The lab tests spend most of their time waiting on real daemons (a job to start, a drain to land, a window to
# pass), so the rest of the suite runs beside them in a second pytest process instead of before them: on the
# 2-core CI machine this takes the suite from ~38 min to the time of the lab tests alone. The two sessions share
# nothing but the red-team Unix user, whose creation takes a file lock (tests/security/redteam.py).
#
# The other suite's output is kept in a file and printed once the lab tests are done, so the two never interleave;
# the exit status is non-zero when either failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.venv/bin}
log=$(mktemp --tmpdir rebound-unit-tests.XXXXXX.log)

"$BIN/pytest" -q -p no:cacheprovider --durations=15 -m "not lab" "$@" >"$log" 2>&1 &
unit=$!
# Either process stopped by Ctrl-C or CI's timeout takes the other with it.
trap 'kill "$unit" 2>/dev/null' EXIT INT TERM

"$BIN/pytest" -q -p no:cacheprovider --durations=25 -m lab "$@"
lab_status=$?
wait "$unit"
unit_status=$?
trap - EXIT INT TERM

echo
echo "===================== the tests beside the lab (pytest -m 'not lab') ====================="
cat "$log"
rm -f "$log"
echo "lab tests: exit $lab_status; the others: exit $unit_status"
# pytest exits 5 when no test was collected (e.g. a path given that holds no lab test): not a failure here.
[ "$lab_status" -eq 5 ] && lab_status=0
[ "$unit_status" -eq 5 ] && unit_status=0
exit $((lab_status != 0 || unit_status != 0))
