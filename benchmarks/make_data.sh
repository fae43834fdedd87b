#!/usr/bin/env bash
# The generated datasets the H200 measurements in docs/performance.md use, made in parallel:
#   /tmp/s800/data.yaml   800 train / 200 val shapes images of 640 px (the race)
#   /tmp/s8k.yaml         8,000 train images (8 shards of 1,000, seeds 1-8), the race's 200 val images
#   /tmp/v5k.yaml         5,000 val images (8 shards of 625) for `libreyolo bench val`
# Usage: benchmarks/make_data.sh [ROOT=/tmp]
set -eu
root=${1:-/tmp}
pids=()
[ -f "$root/s800/data.yaml" ] || { python3 -m libreyolo.cli.main data shapes out="$root/s800" n_train=800 n_val=200 size=640 >/dev/null & pids+=($!); }
for k in 1 2 3 4 5 6 7 8; do
  [ -f "$root/s8k/p$k/data.yaml" ] || { python3 -m libreyolo.cli.main data shapes out="$root/s8k/p$k" n_train=1000 n_val=625 size=640 seed=$k >/dev/null & pids+=($!); }
done
for p in "${pids[@]}"; do wait "$p"; done
names="names: [circle, square, triangle, cross]"
grep -q "^names:" "$root/s800/data.yaml" && names=$(grep -A20 "^names:" "$root/s800/data.yaml")
{
  echo "train:"; for k in 1 2 3 4 5 6 7 8; do echo "  - $root/s8k/p$k/images/train"; done
  echo "val: $root/s800/images/val"; echo "$names"
} > "$root/s8k.yaml"
{
  echo "train: $root/s8k/p1/images/train"
  echo "val:"; for k in 1 2 3 4 5 6 7 8; do echo "  - $root/s8k/p$k/images/val"; done
  echo "$names"
} > "$root/v5k.yaml"
echo "data ready under $root"
