#!/bin/bash
# A small opted-in job for `rebound bench slurm-scale` (deploy/bench/slurm_scale.py): one task that prints a
# training-step line every PERIOD seconds until it is killed or cancelled.
#
# Usage: sbatch [options] scale_job.sh [PERIOD]
#
# A thousand of these run at once on a 2-core host, so a step forks nothing: `read -t` on a pipe nobody writes
# to waits PERIOD seconds inside bash (an external `sleep` per step would cost ~1,000 fork+exec a second).
# The first line names the batch shell's pid: the benchmark kills exactly that process to inject a crash.
set -u
period="${1:-1}"
echo "rebound-scale-job pid=$$ job=${SLURM_JOB_ID:-?} node=${SLURMD_NODENAME:-?}"
exec {idle_fd}<> <(:)
step=0
while true; do
    step=$((step + 1))
    echo "step=${step} loss=0.500 step_time=${period}s"
    read -r -t "${period}" -u "${idle_fd}" _ || true
done
