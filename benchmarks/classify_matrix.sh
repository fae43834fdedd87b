#!/usr/bin/env bash
# docs/performance.md's classifier rows: LibreResNet18 and LibreMNv4s x batch 64/256 at 224 px, float16,
# eager/graph/full (one JSON line per configuration), then one short training run of each on the built-in crops
# (its time and top-1 from the run's results.csv). Usage: benchmarks/classify_matrix.sh OUT_DIR
set -u
out=${1:?usage: classify_matrix.sh OUT_DIR}
mkdir -p "$out"
: > "$out/step.jsonl"
for model in LibreResNet18 LibreMNv4s; do
  for batch in 64 256; do
    python3 -m libreyolo.cli.main bench step model=$model batch=$batch imgsz=224 amp_dtype=float16 \
      warmup=10 steps=24 kernels=false json=true >> "$out/step.jsonl" 2>> "$out/step.err" \
      || echo "FAILED $model $batch" >&2
  done
done
for model in LibreResNet18 LibreMNv4s; do
  start=$(date +%s.%N)
  python3 -m libreyolo.cli.main train model=$model device=0 project="$out/runs" name=$model exist_ok=true \
    > "$out/train-$model.log" 2>&1 || echo "FAILED train $model" >&2
  end=$(date +%s.%N)
  echo "$model wall_s=$(python3 -c "print(round($end - $start, 1))") $(tail -n 1 "$out/runs/$model/results.csv")"
done
