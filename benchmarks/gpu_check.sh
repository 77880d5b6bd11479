#!/usr/bin/env bash
# The GPU check: on a CUDA machine, in a few minutes,
#   1. the parity tests on CUDA in float32, bfloat16 and float16 (tests/gpu_parity.py: every model
#      family against transformers on the device, and the cache, a patching sweep and AtP on it);
#   2. forward, full cache, the resid_pre sweep and AtP against transformers on the GPT-2-small and
#      GPT-2-medium shapes (benchmarks/gpu_check.py), printed as one table.
#   bash benchmarks/gpu_check.sh [PYTHON]        (PYTHON defaults to python3; GLASSBOX_GPU_OUT names the JSON)
# Without CUDA it stops at once, exit status 2, saying so: it never passes for having checked nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${1:-python3}"
if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False, or torch does not import): nothing was run" >&2
    exit 2
fi
"$python" -c 'import torch; print("device:", torch.cuda.get_device_name(0), "| torch", torch.__version__, "| CUDA", torch.version.cuda)'
echo "== 1. parity on CUDA (float32, bfloat16, float16)"
parity=0
GLASSBOX_TEST_DEVICE=cuda "$python" -m pytest -q -s -p no:cacheprovider tests/gpu_parity.py 2>&1 | tee /tmp/gpu_parity.log || parity=$?
echo "== 2. benchmarks against transformers on CUDA"
"$python" benchmarks/gpu_check.py --out "${GLASSBOX_GPU_OUT:-benchmarks/results-gpu.json}"
if [ "$parity" -ne 0 ]; then
    echo "gpu_check: the parity tests FAILED (exit $parity); see above" >&2
    exit 1
fi
echo "gpu_check: parity passed; the table is above"
