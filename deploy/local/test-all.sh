#!/usr/bin/env bash
# `make test`'s pytest part: the end-to-end tests on real labs and everything else, side by side.
#
# The lab tests spend most of their time waiting on real daemons (a job to start, a drain to land, a window to
# pass): on the 2-core CI machine the lab tests used under half a core. So they run on two test labs at once (each
# a whole lab with its own Slurm, Temporal, agents and worker: tests/lab_support.py's slots), and the rest of the
# suite runs beside them in a third pytest process. The files in SECOND_LAB go to the second lab; the split keeps
# the two labs' times near each other (measured with --durations; docs/testing.md). With arguments (paths, -k ...)
# everything given runs on the first lab only.
#
# The other processes' output is kept in files and printed once the first lab's tests are done, so nothing
# interleaves; the exit status is non-zero when any of them failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.venv/bin}

SECOND_LAB=(
    tests/e2e/test_recovery_durability.py
    tests/e2e/test_recovery_scenarios.py
    tests/e2e/test_watch_takeover.py
    tests/e2e/test_detection_scenarios.py
    tests/e2e/test_fleet.py
    tests/e2e/test_resubmission.py
    tests/e2e/test_recovery_slice.py
    tests/e2e/test_gpus_through_agents.py
    tests/e2e/test_log_files.py
    tests/e2e/test_launchers.py
    tests/e2e/test_kernel_log.py
    tests/e2e/test_dcgm_in_the_loop.py
    tests/e2e/test_job_output_claims.py
)

unit_log=$(mktemp --tmpdir rebound-unit-tests.XXXXXX.log)
lab2_log=$(mktemp --tmpdir rebound-lab2-tests.XXXXXX.log)
pids=()
# Any process stopped by Ctrl-C or CI's timeout takes the others with it.
trap 'kill "${pids[@]}" 2>/dev/null' EXIT INT TERM

"$BIN/pytest" -q -p no:cacheprovider --durations=15 -m "not lab" "$@" >"$unit_log" 2>&1 &
unit=$!
pids+=("$unit")

if [ $# -eq 0 ]; then
    # The second lab's demo jobs take the other half of the rendezvous ports (both labs number jobs from 1).
    REBOUND_TEST_LAB_SLOT=1 "$BIN/pytest" -q -p no:cacheprovider --durations=15 -m lab "${SECOND_LAB[@]}" \
        >"$lab2_log" 2>&1 &
    lab2=$!
    pids+=("$lab2")
    ignore=()
    for f in "${SECOND_LAB[@]}"; do ignore+=("--ignore=$f"); done
    "$BIN/pytest" -q -p no:cacheprovider --durations=20 -m lab "${ignore[@]}"
    lab_status=$?
    wait "$lab2"
    lab2_status=$?
else
    "$BIN/pytest" -q -p no:cacheprovider --durations=25 -m lab "$@"
    lab_status=$?
    lab2_status=5
fi
wait "$unit"
unit_status=$?
trap - EXIT INT TERM

if [ $# -eq 0 ]; then
    echo
    echo "===================== the lab tests on the second test lab (REBOUND_TEST_LAB_SLOT=1) ====================="
    cat "$lab2_log"
fi
echo
echo "===================== the tests beside the labs (pytest -m 'not lab') ====================="
cat "$unit_log"
rm -f "$unit_log" "$lab2_log"
echo "lab tests: exit $lab_status (first lab), $lab2_status (second lab); the others: exit $unit_status"
# pytest exits 5 when no test was collected (e.g. a path given that holds no lab test): not a failure here.
for v in lab_status lab2_status unit_status; do [ "${!v}" -eq 5 ] && printf -v "$v" 0; done
exit $((lab_status != 0 || lab2_status != 0 || unit_status != 0))
