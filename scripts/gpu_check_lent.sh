#!/usr/bin/env bash
# The GPU acceptance check on a lent GPU machine, in one command and within 9 minutes on one H200:
#
#   scripts/gpu_check_lent.sh OUT_DIR [gpu_check.py options]
#
# from a checkout where scripts/fetch_gpu_wheels.sh has filled gpu-wheels/ (carried along: it is
# git-ignored). scripts/gpu_check.py runs its sections under a 450 s budget (EXGRPO_GPU_CHECK_BUDGET_S),
# the whole under a 540 s limit (EXGRPO_GPU_CHECK_LIMIT_S), sized for the lent machines' 128 GiB of
# host memory (EXGRPO_HOST_GIB; --host-gib). Into OUT_DIR: gpu_check.json, rewritten after every
# section (a section in flight writes gpu_check.<section>.partial.json as it measures),
# gpu_check.log (stdout and stderr), nvidia-smi.txt and verdict.txt: the table and the verdict,
# printed last also when the limit cut the check short. Exit: the check's (0: passed), 124 when cut.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:?usage: scripts/gpu_check_lent.sh OUT_DIR [gpu_check.py options]}
shift
PYTHON=${PYTHON:-python3}
BUDGET_S=${EXGRPO_GPU_CHECK_BUDGET_S:-450}
LIMIT_S=${EXGRPO_GPU_CHECK_LIMIT_S:-540}
HOST_GIB=${EXGRPO_HOST_GIB:-128}
mkdir -p "$OUT_DIR"
REPORT="$OUT_DIR/gpu_check.json"
if ! compgen -G "gpu-wheels/*.whl" >/dev/null; then
  echo "gpu_check_lent: gpu-wheels/ holds no wheels (run scripts/fetch_gpu_wheels.sh where PyPI is" \
    "reachable and carry the folder); going on with the machine's own modules" >&2
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; } \
  >"$OUT_DIR/nvidia-smi.txt" 2>&1
timeout -k 15 "$LIMIT_S" "$PYTHON" scripts/gpu_check.py --wheels gpu-wheels --budget-s "$BUDGET_S" \
  --host-gib "$HOST_GIB" --out "$REPORT" "$@" 2>&1 | tee "$OUT_DIR/gpu_check.log"
rc=${PIPESTATUS[0]}
if [[ $rc == 124 || $rc == 137 ]]; then
  echo "gpu_check_lent: cut at its limit of $LIMIT_S s; what it measured is in $OUT_DIR"
fi
echo
if [[ -s $REPORT ]]; then
  "$PYTHON" scripts/gpu_check.py --render "$REPORT" | tee "$OUT_DIR/verdict.txt"
fi
exit "$rc"
