#!/usr/bin/env bash
# Fill gpu-wheels/ (or $1) with the pure-Python wheels `make gpu-check` installs on a GPU machine
# that has torch, transformers, numpy, pyarrow, matplotlib, rich and pytest but no network:
# hydra-core, omegaconf, antlr4-python3-runtime 4.9.3 (an sdist only on PyPI: built into a wheel
# here), math-verify and its parser latex2sympy2_extended, peft (model.lora) and accelerate, which
# peft requires (their other requirements, psutil, pyyaml, tqdm and huggingface_hub, come with
# transformers and vLLM; gpu_check.py unpacks only the wheels of modules the machine lacks, so that
# none shadows the image's own); safetensors only when the GPU machine's
# transformers does not bring it (SAFETENSORS=1: a binary wheel for this platform and Python).
# The versions are the ones installed in the Python that runs this (.venv by default: the tested
# ones). Run where PyPI is reachable, then carry the folder with the checkout (it is git-ignored);
# the folder must stay well under the 64 MiB a checkout may carry: this script fails above 30 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-gpu-wheels}
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
LIMIT_MIB=30

version() { "$PYTHON" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }

mkdir -p "$DEST"
rm -f "$DEST"/*.whl
pins=()
for pkg in hydra-core omegaconf math-verify latex2sympy2_extended peft accelerate; do
	pins+=("$pkg==$(version "$pkg")")
done
if [ "${SAFETENSORS:-0}" = 1 ]; then
	pins+=("safetensors==$(version safetensors)")
fi
antlr="antlr4-python3-runtime==$(version antlr4-python3-runtime)"
case "$antlr" in *==4.9.3) ;; *) echo "fetch_gpu_wheels: $antlr installed, 4.9.3 expected" >&2; exit 1 ;; esac

"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --dest "$DEST" "${pins[@]}"
"$PYTHON" -m pip wheel -q --no-deps --wheel-dir "$DEST" "$antlr"

ls -l "$DEST"/*.whl
kib=$(du -sk "$DEST" | cut -f1)
echo "fetch_gpu_wheels: $(ls "$DEST"/*.whl | wc -l) wheels, $((kib)) KiB in $DEST"
if [ "$kib" -gt $((LIMIT_MIB * 1024)) ]; then
	echo "fetch_gpu_wheels: $DEST is over $LIMIT_MIB MiB" >&2
	exit 1
fi
