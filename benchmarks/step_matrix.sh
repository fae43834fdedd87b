#!/usr/bin/env bash
# The docs/performance.md step table: LibreYOLO9t/9s x batch 8/16/64 x float16/bfloat16 x eager/graph/full,
# one JSON line per configuration. Usage: benchmarks/step_matrix.sh OUT.jsonl [extra key=value ...]
set -u
out=${1:?usage: step_matrix.sh OUT.jsonl}
shift
: > "$out"
for model in LibreYOLO9t LibreYOLO9s; do
  for batch in 8 16 64; do
    for dtype in float16 bfloat16; do
      kernels=false
      [ "$batch" = 8 ] && kernels=true
      python3 -m libreyolo.cli.main bench step model=$model batch=$batch imgsz=640 amp_dtype=$dtype \
        warmup=10 steps=24 kernels=$kernels json=true "$@" >> "$out" 2>> "$out.err" || echo "FAILED $model $batch $dtype" >&2
    done
  done
done
