#!/usr/bin/env bash
# The Python packages a sweep needs on a CUDA machine whose image already holds PyTorch and its
# scientific stack but not Ray, MLflow or Optuna, packed small enough to travel with the
# repository (bench/gpu.sh unpacks it):
#
#   bash bench/gpu_wheelhouse.sh [OUT]      # default OUT: .gpu/site.tar.xz (ignored by git)
#
# It downloads the CPython 3.12 manylinux wheels of the versions installed here (the image's
# Python), installs them into a staging folder without their dependencies' resolution on the
# target, leaves out what the image provides (PROVIDED, overridable), then slims: Ray's Java
# workers (ray/jars), the dashboards' source maps and MLflow's web UI (mlflow/server/js) are
# not needed to run trials and log to a sqlite store, and Ray's three ELF binaries lose their
# symbols. The result is one xz archive of the staged site-packages.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.gpu/site.tar.xz}
PY=${PY:-.venv/bin/python}
# Pin what runs here, so the GPU run uses the versions the test suite passed with.
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
WANT="ray[tune]==$(version ray) mlflow==$(version mlflow) optuna==$(version optuna)
torchjd[quadprog-projector]==$(version torchjd)"
# What the CUDA image's Python already has (its PyTorch stack): installing a second copy would
# shadow it, and numpy or protobuf built for another version can break torch's own imports.
PROVIDED=${PROVIDED:-"aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer
click cloudpickle contourpy cycler filelock fonttools frozenlist fsspec h11 idna jinja2 joblib kiwisolver
markupsafe matplotlib msgpack multidict narwhals numpy packaging pandas pillow propcache protobuf pyarrow
pyparsing python-dateutil pyyaml requests scikit-learn scipy six threadpoolctl tqdm typing-extensions
urllib3 werkzeug yarl zipp"}
PLATFORMS="manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64
manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64"
target() { local a=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none);
           for p in $PLATFORMS; do a+=(--platform "$p"); done; a+=(--platform any); echo "${a[@]}"; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "gpu_wheelhouse: resolving $WANT for CPython 3.12 on x86-64"
"$PY" -m pip download -q $(target) -d "$WORK/wheels" $WANT
norm() { tr 'A-Z_.' 'a-z--' <<< "$1"; }
keep=()
for w in "$WORK"/wheels/*.whl; do
  name=$(norm "$(basename "$w" | cut -d- -f1)")
  if grep -qw -- "$name" <<< "$(for p in $PROVIDED; do norm "$p"; done)"; then continue; fi
  keep+=("$w")
done
"$PY" -m pip install -q --no-deps --no-compile $(target) --target "$WORK/site" "${keep[@]}"
before=$(du -sm "$WORK/site" | cut -f1)
rm -rf "$WORK/site/ray/jars" "$WORK/site/mlflow/server/js" "$WORK/site/bin"
find "$WORK/site" -name '*.map' -delete
find "$WORK/site" -name '__pycache__' -prune -exec rm -rf {} +
for elf in _raylet.so core/src/ray/gcs/gcs_server core/src/ray/raylet/raylet; do
  [ -f "$WORK/site/ray/$elf" ] && strip --strip-unneeded "$WORK/site/ray/$elf"
done
after=$(du -sm "$WORK/site" | cut -f1)
mkdir -p "$(dirname "$OUT")"
tar -C "$WORK/site" -cf - . | xz -6 -T0 > "$OUT"
echo "gpu_wheelhouse: ${#keep[@]} packages, ${before} MB staged, ${after} MB slimmed, $(du -m "$OUT" | cut -f1) MB as $OUT"
