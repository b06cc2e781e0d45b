#!/usr/bin/env bash
# The main job: set everything up, then train (on the GPU when there is one, else on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
${PYTHON:-python3} -m nntile_torch.examples.mlp "$@"
