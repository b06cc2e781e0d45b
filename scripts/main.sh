#!/usr/bin/env bash
# The main job: set everything up, then train a GPT-2 converted to tile tasks on an offline byte-level corpus
# (on the GPU when there is one, else on the CPU). Flags go to nntile_torch.train (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
${PYTHON:-python3} -m nntile_torch.train "$@"
