#!/usr/bin/env bash
# The GPU check, in one run: the CUDA tests, the training step against the hand-written loop
# in fp32, TF32 and bf16, real sweeps whose Ray Tune trials share the GPU (four at
# resources.gpu 0.25, then eight at 0.125) checked in MLflow, and, where MiniLM is at hand,
# the fine-tuning recipe as several trainings sharing the GPU.
#
#   bash bench/gpu.sh OUT [GRID_SECONDS] [TOTAL_SECONDS]
#
# Run from the repository root with python3's torch seeing a GPU. Ray, MLflow and Optuna come
# from the environment, or from .gpu/site.tar.xz (bench/gpu_wheelhouse.sh builds it) unpacked
# first. ../shared/data/minbert must exist (the step bench's data); the recipe grid also needs
# ../shared/models/all-MiniLM-L6-v2, and runs only where it is. OUT gets the logs and every
# run's result.json as one archive. GRID_SECONDS (default 300; 0 skips it) bounds the recipe
# grid; TOTAL_SECONDS, when given, shortens the grid so the whole run ends within it (a lent
# GPU's time is counted). SECTIONS (default "tests bench sweep grid") picks what runs.
# The figures are in docs/benchmarks.md and docs/results/reference/.
set -u
OUT=${1:?usage: bash bench/gpu.sh OUT [GRID_SECONDS] [TOTAL_SECONDS]}
GRID_S=${2:-300}
END=$(( $(date +%s) + ${3:-100000} ))
SECTIONS=${SECTIONS:-"tests bench sweep grid"}
python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null ||
  { echo "bench/gpu.sh: no CUDA device visible to python3's torch: nothing to check" >&2; exit 2; }
[ -d ../shared/data/minbert ] ||
  { echo "bench/gpu.sh: ../shared/data/minbert not found (the data the step bench reads)" >&2; exit 2; }
WORK=$(mktemp -d)
mkdir -p "$WORK/logs" "$WORK/runs"
if [ -f .gpu/site.tar.xz ]; then  # the slim wheelhouse: Ray, MLflow, Optuna and what they need
  mkdir -p "$WORK/site" && xz -dc .gpu/site.tar.xz | tar -x -C "$WORK/site"
  export PYTHONPATH=$WORK/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
CFG=docs/results/reference/minilm_cpu.train.yaml
CACHE=$WORK/cache
stamp() { echo "== $(date -u +%T) $*"; }
has() { [[ " $SECTIONS " == *" $1 "* ]]; }

{ nvidia-smi; python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name(0))'
  python3 -c 'import ray, mlflow, optuna; print("ray", ray.__version__, "mlflow", mlflow.__version__, "optuna", optuna.__version__)'
  lscpu | grep -E 'Model name|^CPU\(s\)'; } > "$WORK/logs/env.txt" 2>&1
cat "$WORK/logs/env.txt"

if has tests; then
  stamp "CUDA tests"
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu > "$WORK/logs/tests.txt" 2>&1
  tail -n 15 "$WORK/logs/tests.txt"
fi

# The step in each precision at small and large batches of MiniLM's shape (CS224N's rows are
# short, so at 16 rows the GPU waits on the host) and of BERT-base's.
if has bench; then
  for size in "minilm-shape 16 20" "minilm-shape 128 5" "bert-base 32 10"; do
    read -r enc bs steps <<< "$size"
    stamp "step bench, $enc, batch $bs per task"
    timeout 120 python3 bench/recipe.py --device cuda --encoder "$enc" --batch-size "$bs" --steps "$steps" --rounds 2 \
      > "$WORK/logs/recipe-$enc-b$bs.txt" 2>&1
    tail -n 11 "$WORK/logs/recipe-$enc-b$bs.txt"
  done
fi

# Real sweeps through the CLI: local Ray sees the GPU, each trial asks for a share of it.
if has sweep; then
  STORE="sqlite:///$WORK/mlflow.db"
  for share in "0.25 [0] 4" "0.125 [0,1] 8"; do
    read -r gpu seeds trials <<< "$share"
    name="gpu-share-$gpu"
    stamp "sweep: $trials trials at resources.gpu $gpu"
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -lms 500 > "$WORK/logs/util-$gpu.csv" 2>&1 &
    SMI=$!
    t0=$(date +%s.%N)
    timeout 200 python3 -m mtbert.cli sweep run sweeps/gpu/shared_gpu.yaml --name "$name" --tracking-uri "$STORE" \
      --storage "$WORK/runs" --set "resources.gpu=$gpu" --set "seeds=$seeds" > "$WORK/logs/sweep-$gpu.txt" 2>&1
    echo "sweep exit $?, $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s from the command's start"
    kill $SMI 2>/dev/null
    tail -n 6 "$WORK/logs/sweep-$gpu.txt"
    python3 bench/sweep_check.py --tracking-uri "$STORE" --experiment gpu-share --sweep-run "$name" \
      --trials "$trials" --device cuda --util "$WORK/logs/util-$gpu.csv" 2>&1 | tee "$WORK/logs/check-$gpu.txt"
  done
fi

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

if has grid && [ "$GRID_S" -gt 0 ] && [ -d ../shared/models/all-MiniLM-L6-v2 ]; then
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
