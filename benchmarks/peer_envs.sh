#!/usr/bin/env bash
# Build the virtual environments of the benchmark peers that cannot share the main environment:
#   bash benchmarks/peer_envs.sh [TL4_FOLDER [NNSIGHT_FOLDER]]   (defaults /opt/tl4env, /opt/nnsightenv)
# Each sees the main environment's packages (--system-site-packages: torch, transformers, numpy and the
# editable glassbox) and is constrained never to replace its torch, transformers or numpy, so every
# peer runs on the same kernels. TransformerLens 4.3.0 (TransformerBridge) needs typeguard>=4, which
# would break the main suite's shape checker (typeguard 2.13.3), hence its own environment; nnsight
# 0.8.1 gets one too, so neither can change the other's dependencies.
set -euo pipefail
tl4="${1:-/opt/tl4env}"
nns="${2:-/opt/nnsightenv}"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
python3 - >"$constraints" <<'PY'
import numpy, torch, transformers
print(f"torch=={torch.__version__}\ntransformers=={transformers.__version__}\nnumpy=={numpy.__version__}")
PY
build() {  # build FOLDER PACKAGE...
    local venv="$1"; shift
    python3 -m venv --system-site-packages "$venv"
    "$venv/bin/pip" install -q -c "$constraints" "$@"
    "$venv/bin/python" - <<'PY'
import importlib.metadata as m
print(", ".join(f"{p} {m.version(p)}" for p in ("torch", "transformers", "numpy")))
PY
}
build "$tl4" transformer-lens==4.3.0
build "$nns" nnsight==0.8.1
