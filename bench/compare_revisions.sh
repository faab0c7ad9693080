#!/usr/bin/env bash
# The headline benchmarks (ingest, ONNX import, placement, MoE over HTTP, 3D search) run
# on two revisions back to back, so a refactor's figures sit beside its baseline's on
# the same machine under the same load.
#   bench/compare_revisions.sh BEFORE [AFTER]     (AFTER defaults to HEAD; ~10 minutes)
set -euo pipefail
before=${1:?usage: bench/compare_revisions.sh BEFORE [AFTER]}
after=${2:-HEAD}
repo=$(git rev-parse --show-toplevel)
python=${PYTHON:-$repo/.venv/bin/python}
work=$(mktemp -d)
trap 'git -C "$repo" worktree remove --force "$work/before" >/dev/null 2>&1 || true;
      git -C "$repo" worktree remove --force "$work/after" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
for name in before after; do
  rev=${!name}
  git -C "$repo" worktree add -q --detach "$work/$name" "$rev"
  cd "$work/$name"
  run() { echo "######## $name ($rev): bench.$*"; PYTHONPATH=$PWD "$python" -m "bench.$@"; }
  run ingest --sizes 10000 100000 1000000
  run onnx_ingest --layers 12 120
  run placement --quick
  run moe_http --calls 20 --seconds 10
  run parallel3d | grep -A8 "full search wall time"
done
