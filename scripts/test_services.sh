#!/usr/bin/env bash
# Bring up what the test suite needs beyond Python: a local single-node Slurm (when root and apt are here).
# Tests that need a service skip with a reason when it is missing; CI runs as root, so there nothing is skipped.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ -x "$here/start_slurm.sh" ] && [ "$(id -u)" = 0 ]; then
  "$here/start_slurm.sh" || echo "test_services: local Slurm did not start; Slurm tests will report it" >&2
fi
exit 0
