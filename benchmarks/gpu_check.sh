#!/usr/bin/env bash
# The GPU check (issue 33): benchmarks/train_gpu.py on one CUDA GPU, downloading nothing.
#
#   1. the Qwen3-0.6B shape: a GRPO step through polar.train beside plain PyTorch on the
#      same batches (tokens/s, step time, peak memory, MFU), then the embedded engine
#      (bfloat16, batched decode with a KV cache) beside Hugging Face generate;
#   2. the Qwen3-4B shape with LoRA r=64 (only the adapters train);
#   3. the Qwen3-4B shape, float32 master weights and gradient checkpointing: does a full
#      fine-tune fit one 80 GB GPU, and how fast (plain PyTorch beside it, if it fits).
# About 6 minutes on an H100 (each run is cut at 2.5-3 minutes); everything goes to stdout,
# one JSON line per measurement. Compare with shared/gpu/README.md.
#
# On the GPU machine (Python 3.12 with torch, transformers, peft, numpy, httpx and
# safetensors; no network), from the repository root of a copy holding src/polar,
# benchmarks/ and the wheels below:
#
#     bash benchmarks/gpu_check.sh [WHEELS]        # WHEELS defaults to .cache/gpu-wheels
#
# With Polar's device tool: command "bash benchmarks/gpu_check.sh", carry
# [".cache/gpu-wheels"], timeout_s 600.
#
# The wheels are what Polar imports there beyond that machine's own packages (Python 3.12,
# manylinux x86_64, 3.7 MB). Fetch them once, here, into the ignored .cache/gpu-wheels:
#
#     .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .cache/gpu-wheels \
#       pydantic==2.14.3 pydantic_core==2.50.4 typing-inspection==0.4.5 annotated-types==0.7.0 \
#       typing_extensions==4.16.0 orjson==3.13.0 starlette==1.10.0 pyyaml==6.0.3
#
# They are installed with --no-deps into a scratch folder put first on PYTHONPATH (removed
# at the end); the machine's own environment is never changed.
#
# Without a GPU, the same runs on the CPU with the tiny shape (no wheels: this project's
# environment has everything), as evidence that they execute:
#
#     PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh --cpu
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
MODE=gpu
WHEELS=.cache/gpu-wheels
for arg in "$@"; do
  case "$arg" in
    --cpu) MODE=cpu ;;
    -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
    *) WHEELS=$arg ;;
  esac
done

SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
if [ "$MODE" = gpu ]; then
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    echo "gpu_check: no wheels in $WHEELS (the header of $0 says how to fetch them)" >&2
    exit 2
  fi
  "$PYTHON" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl || exit 2
fi
export PYTHONPATH="$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

echo "== gpu_check ($MODE) $(date -u +%FT%TZ)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
"$PYTHON" -c 'import importlib, sys
for name in ("torch", "transformers", "peft", "pydantic", "orjson", "starlette"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as exc:
        print(name, "missing:", exc)
print("python", sys.version.split()[0])'

failed=0
run() {
  local limit=$1
  shift
  echo "== benchmarks/train_gpu.py $*"
  local started=$SECONDS
  timeout "$limit" "$PYTHON" benchmarks/train_gpu.py "$@"
  local code=$?
  echo "== exit $code after $((SECONDS - started)) s"
  [ "$code" -eq 0 ] || failed=1
}

if [ "$MODE" = gpu ]; then
  run 180 --shape qwen3-0.6b
  run 150 --shape qwen3-4b --gradient-checkpointing --lora 64 --no-engine --no-baseline
  run 180 --shape qwen3-4b --gradient-checkpointing --no-engine
else
  small=(--device cpu --shape tiny --groups 2 --group-size 2 --prompt 64 --response 32
         --micro-batch-tokens 256 --engine-batch 4 --engine-prompt 32 --engine-new 16)
  run 300 "${small[@]}"
  run 300 "${small[@]}" --gradient-checkpointing --no-engine
  run 300 "${small[@]}" --gradient-checkpointing --lora 8 --no-engine
fi
echo "== gpu_check done: $([ "$failed" -eq 0 ] && echo ok || echo 'a run failed')"
exit "$failed"
