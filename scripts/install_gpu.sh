#!/usr/bin/env bash
# Build the CUDA venv of a GPU node: exgrpo with its `gpu` extra (vLLM, which pins its own CUDA
# torch, and the hub dataset loader), from wheels only, so that nothing compiles for an hour or
# half-builds against the wrong CUDA. Usage, from anywhere:
#   scripts/install_gpu.sh                      # <repo>/.venv (what `make test` / `make run` use)
#   GPU_VENV=/elsewhere scripts/install_gpu.sh
#   FLASH_ATTN_WHEEL=<file or URL of a prebuilt flash_attn wheel> scripts/install_gpu.sh
#   DRY_RUN=1 scripts/install_gpu.sh            # resolve and print what would be installed
#
# Wheels only has one exception: antlr4-python3-runtime 4.9.3 (pinned by hydra-core 1.3 and by
# math-verify's antlr4_9_3 extra) exists on PyPI as a source archive only; it is pure Python, so
# building it runs no compiler.
#
# flash-attn is optional (the trainer uses sdpa without it). PyPI has no flash-attn wheels, only a
# source archive that compiles CUDA kernels; its GitHub releases ship prebuilt wheels named after
# what they were built for, e.g. flash_attn-<ver>+cu<CUDA>torch<torch major.minor>cxx11abi<TRUE|FALSE>-
# cp311-cp311-linux_x86_64.whl: pick the one matching this venv's torch and CUDA (printed at the
# end) and pass it as FLASH_ATTN_WHEEL; it goes in with --no-deps so that it cannot move torch.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${GPU_VENV:-$REPO/.venv}"
PYTHON="${PYTHON:-python3}"
EXTRAS="${GPU_EXTRAS:-gpu,dev}"
WHEELS_ONLY=(--only-binary=:all: --no-binary=antlr4-python3-runtime)

start=$(date +%s)
if [ -n "${DRY_RUN:-}" ]; then
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' EXIT
    "$PYTHON" -m venv "$scratch/venv"
    "$scratch/venv/bin/python" -m pip install -q --upgrade pip
    "$scratch/venv/bin/python" -m pip install --dry-run --quiet --report "$scratch/report.json" \
        "${WHEELS_ONLY[@]}" "$REPO[$EXTRAS]"
    "$scratch/venv/bin/python" - "$scratch/report.json" <<'EOF'
import json, sys
picked = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]}
print(f"{len(picked)} packages would be installed; " + ", ".join(
    f"{name} {picked[name]}" for name in ("torch", "vllm", "transformers", "datasets", "flashinfer-python") if name in picked))
EOF
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip
"${PIP[@]}" install "${WHEELS_ONLY[@]}" -e "$REPO[$EXTRAS]"
if [ -n "${FLASH_ATTN_WHEEL:-}" ]; then
    "${PIP[@]}" install --no-deps --only-binary=:all: "$FLASH_ATTN_WHEEL"
fi

# fail loudly here rather than at the first rollout: a CUDA torch whose CUDA this node's driver
# runs (vLLM's torch is built for CUDA 13: driver >= 580), a vLLM whose model runner takes
# reload_weights(weights_iterator=...), and (when asked for) a flash-attn that loads
"$VENV/bin/python" "$REPO/scripts/gpu_driver_check.py"
"$VENV/bin/python" - <<'EOF'
import importlib.util

import torch
import vllm

from exgrpo_cli.rollout.vllm_weights import check_reload_api

check_reload_api(vllm)
flash = "not installed (sdpa)"
if importlib.util.find_spec("flash_attn") is not None:
    import flash_attn

    flash = flash_attn.__version__
abi = "TRUE" if torch.compiled_with_cxx11_abi() else "FALSE"
print(
    f"vllm {vllm.__version__}, torch {torch.__version__} (CUDA {torch.version.cuda}, cxx11abi {abi}), "
    f"flash-attn {flash}; GPUs visible: {torch.cuda.device_count()}"
)
EOF
end=$(date +%s)
echo "$VENV ready in $((end - start)) s ($(du -sh "$VENV" | cut -f1))"
