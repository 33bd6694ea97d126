#!/usr/bin/env bash
# The main job: start the nbmpi controller, run one example MPI job through it
# (2 ranks, traced), print its output, trace summary and where the dashboard will be,
# then stop the controller. Usage: deploy/main_job.sh [RANKS] [DATA_DIR]
set -euo pipefail
ranks="${1:-2}"
if [ -n "${2:-}" ]; then
  exec nbmpi demo -n "$ranks" --data-dir "$2"
fi
exec nbmpi demo -n "$ranks"
