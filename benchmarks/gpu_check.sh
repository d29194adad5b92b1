#!/usr/bin/env bash
# The GPU check of issue 26, for a lent CUDA machine: DDP against FSDP2 with bf16 on CUDA, one process per GPU, the
# built-in `base` model (99M parameters), 16 sequences x 512 tokens per step: per-rank training state, peak allocated
# memory, seconds per step, tokens per second and the cost of gathering the weights for sampling
# (benchmarks/sharding.py does the measuring). Under 5 minutes: the measuring is cut at 240 s.
#
#   benchmarks/gpu_check.sh [FIGURES_FILE]     default: $OUT/gpu_check.md when $OUT is set, else ./gpu_check.md
#
# Without a CUDA GPU it says so and runs the same script's CPU path on the `small` model (a smoke run of the
# script itself, whose figures are not the GPU's), so the script can be checked anywhere.
#
# Then, where `import vllm` works (issue 33; `pip install -e ".[vllm]"` on the GPU machine, or PYTHON=<a venv's
# python> that has it): rollout engines on the GPU (benchmarks/engines.py --device cuda: tokens/s of our sampler, HF
# generate and vLLM colocated and served, bf16, and a GRPO iteration with each, tiny and base) and GRPO on vLLM
# (benchmarks/vllm_gpu_check.py: colocated, sleep mode between rollouts, LoRA adapter pushes, a server sharing the
# GPU). About 6 more minutes, each part cut at its own timeout. The vLLM part has not been run yet (written on a
# machine without a GPU): its first run is its test.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python}"
figures="${1:-${OUT:-.}/gpu_check.md}"
mkdir -p "$(dirname "$figures")"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
cd "$repo"

{
    echo "# gpu_check.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo
    "$python" -c "import platform, torch, transformers; print('Python', platform.python_version(), '| torch', \
torch.__version__, '| CUDA', torch.version.cuda, '| transformers', transformers.__version__)"
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    fi
    echo
} > "$figures"

gpus="$("$python" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")"
if [ "$gpus" -eq 0 ]; then
    echo "no CUDA GPU here: running the CPU path on 'small' as a smoke run of the script" | tee -a "$figures" >&2
    timeout 240 "$python" benchmarks/sharding.py --device cpu --models small --rows 4 --tokens 32 --steps 2 \
        --out "$figures"
else
    timeout 240 "$python" benchmarks/sharding.py --device cuda --compute-dtype bf16 --models base \
        --processes "$gpus" --rows 16 --tokens 512 --steps 6 --out "$figures"
fi
if [ "$gpus" -gt 0 ] && "$python" -c "import vllm" 2> /dev/null; then
    log="${figures%.md}_vllm.log"  # vLLM's own output, apart from the figures
    echo -e "\n## Rollout engines on the GPU (benchmarks/engines.py --device cuda)\n" >> "$figures"
    timeout 300 "$python" benchmarks/engines.py --device cuda --models tiny base --new-tokens 256 --repeats 3 \
        --iterations 2 --threads 8 2>> "$log" | grep -v "^tiny \|^base " >> "$figures" \
        || echo "(engines.py stopped: exit $?; see $log)" >> "$figures"
    timeout 300 "$python" benchmarks/vllm_gpu_check.py --out "$figures" --model base --iterations 3 >> "$log" 2>&1 \
        || echo "(vllm_gpu_check.py stopped: exit $?; see $log)" >> "$figures"
else
    echo -e "\nvLLM checks skipped: no CUDA GPU or no vLLM here (pip install -e \".[vllm]\")" >> "$figures"
fi
echo "figures written to $figures" >&2
cat "$figures"
