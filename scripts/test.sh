#!/usr/bin/env bash
# The test command: set everything up (scripts/setup.sh), then run the test suite. GPU tests are skipped
# without CUDA; on the GPU machine they run through dev/gpu_machine/h200.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
${PYTHON:-python3} -m pytest -q -rs tests "$@"
