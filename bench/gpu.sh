#!/usr/bin/env bash
# The GPU check, in one run: the CUDA tests, the training step against the hand-written loop
# on the GPU (MiniLM and a BERT-base-shaped encoder), and the fine-tuning recipe on MiniLM with
# the whole CS224N data as several trainings sharing the one GPU.
#
#   bash bench/gpu.sh OUT [GRID_SECONDS] [TOTAL_SECONDS]
#
# Run from the repository root with torch and transformers installed (Ray and MLflow are not
# needed: these are the library's own paths). ../shared/models/all-MiniLM-L6-v2 and
# ../shared/data/minbert must exist. OUT gets the logs and every run's result.json as one
# archive. GRID_SECONDS (default 300; 0 skips it) bounds the recipe grid: a run cut off by it keeps the
# evaluations it printed; TOTAL_SECONDS, when given, shortens the grid so the whole run ends
# within it (a lent GPU's time is counted). The figures are in docs/benchmarks.md and docs/results/reference.md.
set -u
OUT=${1:?usage: bash bench/gpu.sh OUT [GRID_SECONDS] [TOTAL_SECONDS]}
GRID_S=${2:-300}
END=$(( $(date +%s) + ${3:-100000} ))
python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null ||
  { echo "bench/gpu.sh: no CUDA device visible to python3's torch: nothing to check" >&2; exit 2; }
for need in ../shared/models/all-MiniLM-L6-v2 ../shared/data/minbert; do
  [ -d "$need" ] || { echo "bench/gpu.sh: $need not found (the encoder and data the runs read)" >&2; exit 2; }
done
WORK=$(mktemp -d)
mkdir -p "$WORK/logs" "$WORK/runs"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
CFG=docs/results/reference/minilm_cpu.train.yaml
CACHE=$WORK/cache
stamp() { echo "== $(date -u +%T) $*"; }

{ nvidia-smi; python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name(0))'
  lscpu | grep -E 'Model name|^CPU\(s\)'; } > "$WORK/logs/env.txt" 2>&1
cat "$WORK/logs/env.txt"

stamp "CUDA tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu > "$WORK/logs/tests.txt" 2>&1
tail -n 15 "$WORK/logs/tests.txt"

# The step at two sizes of each encoder: a small batch (CS224N's rows are short, so the GPU
# waits on the host there) and a large one.
for size in "minilm 16 20" "minilm 128 5" "bert-base 32 10" "bert-base 128 4"; do
  read -r enc bs steps <<< "$size"
  stamp "step bench, $enc, batch $bs per task"
  timeout 150 python3 bench/recipe.py --device cuda --encoder "$enc" --batch-size "$bs" --steps "$steps" --rounds 3 \
    > "$WORK/logs/recipe-$enc-b$bs.txt" 2>&1
  tail -n 9 "$WORK/logs/recipe-$enc-b$bs.txt"
done

# The recipe grid: each line a run name and its overrides of the reference config. Every run
# scores the full dev sets every 500 steps (its learning curve) for up to 4,000 steps.
GRID="r-s0 train.seed=0
r-s1 train.seed=1
r-s2 train.seed=2
lr1e-4 optim.lr=1e-4
lr3e-5 optim.lr=3e-5
bs32-lr1e-4 train.batch_size=32 optim.lr=1e-4
decay0.8-lr1e-4 optim.layer_decay=0.8 optim.lr=1e-4
probe train.probe=true
smart loss.smart.weight=1.0
cross pairs.encoding=cross sts.head=regression
heads-lr3e-3 optim.head_lr=3e-3
wd0.1 optim.weight_decay=0.1"
COMMON="train.device=cuda sampling.steps_per_epoch=500 train.epochs=8 train.patience=null
train.save_checkpoint=false data.cache_dir=$CACHE"
sets() { for kv in $COMMON "$@"; do printf -- '--set %s ' "$kv"; done; }

if [ "$GRID_S" -gt 0 ]; then  # GRID_SECONDS 0: the tests and the step benches only
  stamp "tokenizing once for the grid"
  timeout 120 python3 -m mtbert.cli train --config $CFG $(sets train.epochs=1 sampling.steps_per_epoch=1) \
    --output "$WORK/runs/warm" > "$WORK/logs/warm.txt" 2>&1
  tail -n 3 "$WORK/logs/warm.txt"

  LEFT=$(( END - $(date +%s) - 25 ))
  [ "$LEFT" -lt "$GRID_S" ] && GRID_S=$LEFT
  stamp "recipe grid: $(echo "$GRID" | wc -l) runs on one GPU, at most $GRID_S s"
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 10 > "$WORK/logs/gpu-util.csv" 2>&1 &
  SMI=$!
  while read -r name overrides; do
    OMP_NUM_THREADS=1 timeout "$GRID_S" python3 -m mtbert.cli train --config $CFG $(sets $overrides) \
      --output "$WORK/runs/$name" > "$WORK/logs/grid-$name.txt" 2>&1 &
  done <<< "$GRID"
  wait $(jobs -p | grep -v "^$SMI$") 2>/dev/null
  kill $SMI 2>/dev/null
  for f in "$WORK"/logs/grid-*.txt; do echo "-- $(basename "$f" .txt)"; grep -E '^epoch|error' "$f" | tail -n 8; done
fi

stamp "packing"
for r in "$WORK"/runs/*/; do [ -f "$r/result.json" ] && cp "$r/result.json" "$WORK/logs/result-$(basename "$r").json"; done
mkdir -p "$OUT"
tar -czf "$OUT/gpu-check.tar.gz" -C "$WORK" logs
stamp done
