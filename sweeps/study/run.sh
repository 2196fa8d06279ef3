#!/usr/bin/env bash
# Runs the study's six files one after another into one store (runs/study/), resuming a file
# whose driver died and skipping one that finished. Each file's wall time goes to
# runs/study/walls.tsv. From the project root:   bash sweeps/study/run.sh
set -euo pipefail
mtbert=${MTBERT:-.venv/bin/mtbert}
store=runs/study
mkdir -p "$store"
uri="sqlite:///$PWD/$store/mlflow.db"
for f in head_regimes_frozen loss_weights_frozen freezing pals encoder_sharing cascade; do
  name=${f//_/-}
  [ -e "$store/$name.done" ] && continue
  start=$(date +%s)
  if [ -d "$store/tune/$name" ]; then
    "$mtbert" sweep resume "$name" --storage "$store/tune" --num-cpus 2
  else
    "$mtbert" sweep run "sweeps/study/$f.yaml" --num-cpus 2 --name "$name" \
      --tracking-uri "$uri" --storage "$store/tune"
  fi
  end=$(date +%s)
  printf '%s\t%s\t%s\t%s\n' "$name" "$(date -u -d @"$start" +%FT%TZ)" "$((end - start))" \
    "$(lscpu | grep -o -E 'amx_bf16|avx512_bf16|avx2' | sort -u | tr '\n' ' ')" >> "$store/walls.tsv"
  touch "$store/$name.done"
done
"$mtbert" findings sweeps/study/*.yaml --tracking-uri "$uri" --output docs/results/study/findings.md
