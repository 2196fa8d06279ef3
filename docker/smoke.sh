#!/usr/bin/env bash
# The cluster images built and a real sweep run in them, on this one host:
#
#   docker/smoke.sh                                  # base images pulled from the registry
#   docker/smoke.sh --debian-base --local-torch      # no image registry, no CUDA download
#
# It builds docker/Dockerfile, docker/mlflow.Dockerfile and docker/postgres.Dockerfile, starts
# PostgreSQL, the MLflow server (basic-auth app, PostgreSQL store, artifacts served from the
# shared volume), a Ray head (no trials) and one Ray worker in containers, submits
# sweeps/smoke.yaml --smoke with `mtbert sweep submit` and follows it, asks `mtbert sweep
# status` and `stop` about the job, runs the same sweep with its driver started on the head,
# and checks MLflow (every trial FINISHED exactly once, on the worker, with its figures and
# artifacts) and `mtbert leaderboard` against the server. It prints build times, image sizes
# and the table (docs/cluster.md, docs/docker-smoke.md).
#
# Host networking, on free ports so it runs beside anything else: PostgreSQL, MLflow and the Ray
# dashboard listen on 127.0.0.1 only, the Ray nodes take 127.0.0.1 and 127.0.0.2 as their
# addresses (Ray's own servers listen on every interface, as on any Ray host, behind the token).
# docs/cluster.md's compose stack is the same containers on a compose network. Secrets come fresh from docker/gen_env.py on every run and
# go to the containers through env files readable by their owner only. Every container and
# volume it made is removed on exit, whatever the outcome; the run's logs and files stay in
# runs/docker-smoke/. Runs again from scratch each time (builds reuse Docker's cache).
#
# Options:
#   --base IMAGE    base of the three images (default python:3.11-slim)
#   --debian-base   make the base from Debian's packages with debootstrap (root; once, kept as
#                   mtbert-smoke-base:bookworm), trusting this host's CA certificates, for hosts
#                   that reach the package registries but no image registry
#   --wheels DIR    a folder of wheels the torch step may take torch from (served to the build
#                   on loopback); torch's dependencies still come from PyPI
#   --local-torch   put TORCH_SPEC's wheel in such a folder with this host's pip and settings
#   --clean         also remove the images it built at the end (Docker's build cache stays:
#                   `docker builder prune` reclaims it)
#
# Environment: PYTHON (default python3: an interpreter with this project installed, for
# `mtbert` and the checks), DOCKER (default docker), TORCH_SPEC (default torch==2.13.0).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
DOCKER=${DOCKER:-docker}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
BASE=python:3.11-slim
DEBIAN_BASE=mtbert-smoke-base:bookworm
MAKE_DEBIAN_BASE=0
WHEELS=
LOCAL_TORCH=0
CLEAN=0

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
        --base) BASE=${2:?--base IMAGE}; shift ;;
        --debian-base) BASE=$DEBIAN_BASE; MAKE_DEBIAN_BASE=1 ;;
        --wheels) WHEELS=$(cd "${2:?--wheels DIR}" && pwd); shift ;;
        --local-torch) LOCAL_TORCH=1 ;;
        --clean) CLEAN=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "smoke.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
cd "$ROOT"

PREFIX=mtbert-smoke
IMAGE=mtbert:smoke
MLFLOW_IMAGE=mtbert-mlflow:smoke
POSTGRES_IMAGE=mtbert-postgres:smoke
CONTAINERS=("$PREFIX-postgres" "$PREFIX-mlflow" "$PREFIX-ray-head" "$PREFIX-ray-worker")
VOLUMES=("$PREFIX-shared" "$PREFIX-postgres" "$PREFIX-mlflow-auth")
HEAD_IP=127.0.0.1
WORKER_IP=127.0.0.2  # its own loopback address: MLflow's node_ip tag then shows where trials ran
SWEEP=docker-smoke
STATE=runs/docker-smoke  # under the project root, the working folder from here on
# The Dockerfiles need BuildKit (RUN --mount, COPY --chmod, per-Dockerfile .dockerignore).
export DOCKER_BUILDKIT=1

say() { printf '\n== %s\n' "$*"; }
die() { printf 'smoke.sh: %s\n' "$*" >&2; exit 1; }
docker() { command "$DOCKER" "$@"; }  # command: never this function itself
mtbert() { "$PYTHON" -m mtbert.cli "$@"; }

docker info >/dev/null 2>&1 || die "no Docker daemon answers (\`$DOCKER info\` failed)"
client=$(docker version -f '{{.Client.Version}}')
if [ "${client%%.*}" -ge 23 ] && ! docker buildx version >/dev/null 2>&1; then
    # Before 23.0 the client has BuildKit built in; since, only through the buildx plugin.
    die "docker $client builds with BuildKit only through the buildx plugin: install it"
fi
"$PYTHON" -c "import mtbert, orchestration" 2>/dev/null \
    || die "$PYTHON cannot import mtbert: set PYTHON to the project's interpreter (e.g. .venv/bin/python)"

# --------------------------------------------------------------------------- clean slate, cleanup

remove_stack() {
    docker rm -f "${CONTAINERS[@]}" >/dev/null 2>&1 || true
    docker volume rm "${VOLUMES[@]}" >/dev/null 2>&1 || true
}

WHEEL_SERVER=
ROOTFS=
on_exit() {
    local rc=$?
    trap - EXIT INT TERM
    for name in "${CONTAINERS[@]}"; do  # their logs outlive them
        docker logs "$name" >"$STATE/logs/$name.log" 2>&1 || rm -f "$STATE/logs/$name.log"
    done
    remove_stack
    [ -z "$WHEEL_SERVER" ] || kill "$WHEEL_SERVER" 2>/dev/null || true
    [ -z "$ROOTFS" ] || rm -rf "$ROOTFS"
    if [ "$CLEAN" = 1 ]; then
        docker rmi "$IMAGE" "$MLFLOW_IMAGE" "$POSTGRES_IMAGE" >/dev/null 2>&1 || true
        [ "$MAKE_DEBIAN_BASE" = 0 ] || docker rmi "$DEBIAN_BASE" >/dev/null 2>&1 || true
    fi
    if [ "$rc" = 0 ]; then
        say "smoke test passed (logs: runs/docker-smoke/)"
    else
        printf '\nsmoke.sh: FAILED (exit %s); container logs in %s/logs/\n' "$rc" "$STATE" >&2
    fi
    exit "$rc"
}

remove_stack  # a run killed before its trap ran leaves these behind
rm -rf "$STATE"
mkdir -p "$STATE/logs"
chmod 700 "$STATE"
trap on_exit EXIT
trap 'exit 130' INT TERM

# --------------------------------------------------------------------------- secrets and ports

# Fresh secrets every run, by the same generator docker/.env comes from.
"$PYTHON" docker/gen_env.py --print >"$STATE/secrets.env"
chmod 600 "$STATE/secrets.env"
declare -A ENV
while IFS='=' read -r key value; do
    case $key in ''|\#*) continue ;; esac
    ENV[$key]=$value
done <"$STATE/secrets.env"

# Ports free now on loopback; Ray picks its other ports itself.
read -r PG_PORT MLFLOW_PORT GCS_PORT DASH_PORT CLIENT_PORT HEAD_AGENT_PORT WORKER_AGENT_PORT < <(
    "$PYTHON" -c "
import socket
socks = [socket.socket() for _ in range(7)]
for s in socks:
    s.bind(('127.0.0.1', 0))
print(*(s.getsockname()[1] for s in socks))")
MLFLOW_URI=http://$HEAD_IP:$MLFLOW_PORT
DASHBOARD=http://$HEAD_IP:$DASH_PORT

# One env file per container, holding only what that container needs.
env_file() {  # NAME KEY=VALUE...
    local file=$STATE/$1.env
    shift
    (umask 077 && printf '%s\n' "$@" >"$file")
    printf '%s' "$file"
}
POSTGRES_ENV=$(env_file postgres "POSTGRES_USER=${ENV[POSTGRES_USER]}" "POSTGRES_PASSWORD=${ENV[POSTGRES_PASSWORD]}" \
               "POSTGRES_DB=${ENV[POSTGRES_DB]}")
MLFLOW_ENV=$(env_file mlflow "PGUSER=${ENV[POSTGRES_USER]}" "PGPASSWORD=${ENV[POSTGRES_PASSWORD]}" \
             "MLFLOW_AUTH_ADMIN_USERNAME=${ENV[MLFLOW_ADMIN_USERNAME]}" \
             "MLFLOW_AUTH_ADMIN_PASSWORD=${ENV[MLFLOW_ADMIN_PASSWORD]}" \
             "MLFLOW_FLASK_SERVER_SECRET_KEY=${ENV[MLFLOW_FLASK_SECRET_KEY]}" \
             "MLFLOW_SERVER_ALLOWED_HOSTS=$HEAD_IP:$MLFLOW_PORT,localhost:$MLFLOW_PORT" \
             "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false")
MLFLOW_INIT_ENV=$(env_file mlflow-init "MLFLOW_TRACKING_USERNAME=${ENV[MLFLOW_ADMIN_USERNAME]}" \
                  "MLFLOW_TRACKING_PASSWORD=${ENV[MLFLOW_ADMIN_PASSWORD]}" \
                  "MLFLOW_SWEEP_USERNAME=${ENV[MLFLOW_SWEEP_USERNAME]}" \
                  "MLFLOW_SWEEP_PASSWORD=${ENV[MLFLOW_SWEEP_PASSWORD]}")
HEAD_ENV=$(env_file ray-head "RAY_AUTH_MODE=token" "RAY_AUTH_TOKEN=${ENV[RAY_AUTH_TOKEN]}" \
           "MLFLOW_TRACKING_URI=$MLFLOW_URI" "MLFLOW_TRACKING_USERNAME=${ENV[MLFLOW_SWEEP_USERNAME]}" \
           "MLFLOW_TRACKING_PASSWORD=${ENV[MLFLOW_SWEEP_PASSWORD]}")
WORKER_ENV=$(env_file ray-worker "RAY_AUTH_MODE=token" "RAY_AUTH_TOKEN=${ENV[RAY_AUTH_TOKEN]}")

# --------------------------------------------------------------------------- images

if [ "$MAKE_DEBIAN_BASE" = 1 ] && ! docker image inspect "$DEBIAN_BASE" >/dev/null 2>&1; then
    say "base image $DEBIAN_BASE from Debian's packages"
    command -v debootstrap >/dev/null || die "--debian-base needs debootstrap (apt-get install debootstrap)"
    [ "$(id -u)" = 0 ] || die "--debian-base makes its base image as root (debootstrap)"
    start=$(date +%s)
    ROOTFS=$(mktemp -d)
    chmod 755 "$ROOTFS"  # the image's / : mktemp's 0700 would lock every non-root user out
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$ROOTFS" \
        >"$STATE/logs/debootstrap.log"
    # The builds download through this host's network: trust what it trusts (a TLS-inspecting
    # proxy's CA included).
    cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
    rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/lib/apt/lists/*
    # An imported file system has no image config: PATH is what later ENV lines extend.
    tar -C "$ROOTFS" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' --change 'CMD ["bash"]' - "$DEBIAN_BASE" >/dev/null
    rm -rf "$ROOTFS"
    ROOTFS=
    BASE_S=$(( $(date +%s) - start ))
    echo "made $DEBIAN_BASE in $BASE_S s"
fi

TORCH_ARGS=()
if [ "$LOCAL_TORCH" = 1 ]; then
    say "torch wheel ($TORCH_SPEC) with this host's pip"
    WHEELS=$STATE/wheels
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$WHEELS" "$TORCH_SPEC"
    ls "$WHEELS"
fi
if [ -n "$WHEELS" ]; then
    # The folder's URL is a build argument, and a changed build argument rebuilds every step
    # after it: the same port each run keeps the cache (another one only when it is taken).
    read -r WHEEL_PORT < <("$PYTHON" -c "
import socket
s = socket.socket()
try:
    s.bind(('127.0.0.1', 38765))
except OSError:
    s.bind(('127.0.0.1', 0))
print(s.getsockname()[1])")
    "$PYTHON" -m http.server "$WHEEL_PORT" --bind 127.0.0.1 --directory "$WHEELS" \
        >"$STATE/logs/wheel-server.log" 2>&1 &
    WHEEL_SERVER=$!
    # The index then is plain PyPI (torch's dependencies); the wheel wins as the exact match.
    TORCH_ARGS=(--build-arg "TORCH_FIND_LINKS=http://127.0.0.1:$WHEEL_PORT/" --build-arg "TORCH_INDEX=")
fi

declare -A BUILD_S
build() {  # NAME CONTEXT DOCKERFILE TAG [ARGS...]
    local name=$1 context=$2 file=$3 tag=$4 start
    shift 4
    say "build $tag ($file, base $BASE)"
    start=$(date +%s)
    # Host network: the builds reach the package registries and the wheel folder on loopback.
    docker build --network host --progress plain -f "$file" --build-arg "BASE=$BASE" "$@" \
        -t "$tag" "$context" >"$STATE/logs/build-$name.log" 2>&1 \
        || { tail -n 40 "$STATE/logs/build-$name.log" >&2; die "building $tag failed"; }
    BUILD_S[$name]=$(( $(date +%s) - start ))
    echo "built $tag in ${BUILD_S[$name]} s"
}
build mtbert . docker/Dockerfile "$IMAGE" --build-arg "TORCH_SPEC=$TORCH_SPEC" "${TORCH_ARGS[@]}"
build mlflow docker docker/mlflow.Dockerfile "$MLFLOW_IMAGE"
build postgres docker docker/postgres.Dockerfile "$POSTGRES_IMAGE"
[ -z "$WHEEL_SERVER" ] || { kill "$WHEEL_SERVER"; WHEEL_SERVER=; }

# --------------------------------------------------------------------------- the stack

running() { [ "$(docker inspect -f '{{.State.Running}}' "$1" 2>/dev/null)" = true ]; }

wait_until() {  # CONTAINER SECONDS WHAT COMMAND...: COMMAND run in the container until it succeeds
    local name=$1 deadline=$(( $(date +%s) + $2 )) what=$3
    shift 3
    until docker exec "$name" "$@" >/dev/null 2>&1; do
        running "$name" || { docker logs --tail 40 "$name" >&2; die "$name exited before $what"; }
        [ "$(date +%s)" -lt "$deadline" ] || { docker logs --tail 40 "$name" >&2; die "$name: no $what after $2 s"; }
        sleep 2
    done
    echo "$name: $what"
}

say "volumes and PostgreSQL"
for volume in "${VOLUMES[@]}"; do docker volume create "$volume" >/dev/null; done
docker run -d --name "$PREFIX-postgres" --network host --env-file "$POSTGRES_ENV" \
    -v "$PREFIX-postgres:/var/lib/postgresql/data" "$POSTGRES_IMAGE" \
    -c "listen_addresses=$HEAD_IP" -c "port=$PG_PORT" >/dev/null
wait_until "$PREFIX-postgres" 120 "accepting connections" \
    pg_isready -h "$HEAD_IP" -p "$PG_PORT" -U "${ENV[POSTGRES_USER]}" -d "${ENV[POSTGRES_DB]}"

# The head before MLflow, unlike compose (nothing on it calls MLflow before a sweep): a fresh
# named volume takes the owner of the folder it is first mounted over, and the image's /shared
# belongs to the non-root user every Ray node and the MLflow server run as (uid 1000).
say "Ray head"
RAY_NODE=(--network host --shm-size 2g -v "$PREFIX-shared:/shared")
docker run -d --name "$PREFIX-ray-head" "${RAY_NODE[@]}" --env-file "$HEAD_ENV" "$IMAGE" \
    ray start --head --block --node-ip-address="$HEAD_IP" --port="$GCS_PORT" \
    --dashboard-host="$HEAD_IP" --dashboard-port="$DASH_PORT" \
    --dashboard-agent-listen-port="$HEAD_AGENT_PORT" --ray-client-server-port="$CLIENT_PORT" \
    --num-cpus="${ENV[RAY_HEAD_CPUS]}" --object-store-memory="${ENV[RAY_OBJECT_STORE_BYTES]}" \
    --disable-usage-stats >/dev/null
wait_until "$PREFIX-ray-head" 180 "healthy" mtbert-healthcheck \
    "$DASHBOARD/api/gcs_healthz" "http://$HEAD_IP:$HEAD_AGENT_PORT/api/local_raylet_healthz"

say "MLflow server at $MLFLOW_URI"
docker run -d --name "$PREFIX-mlflow" --network host --env-file "$MLFLOW_ENV" \
    -v "$PREFIX-mlflow-auth:/mlflow/auth" -v "$PREFIX-shared:/shared" "$MLFLOW_IMAGE" \
    mlflow server --app-name=basic-auth --host="$HEAD_IP" --port="$MLFLOW_PORT" \
    "--backend-store-uri=postgresql+psycopg2://$HEAD_IP:$PG_PORT/${ENV[POSTGRES_DB]}" \
    --serve-artifacts --artifacts-destination=/shared/mlflow-artifacts >/dev/null
wait_until "$PREFIX-mlflow" 180 "healthy" mtbert-healthcheck "$MLFLOW_URI/health"
# compose's one-shot mlflow-init, run in the server's container (same image, same command).
docker exec --env-file "$MLFLOW_INIT_ENV" "$PREFIX-mlflow" \
    python /usr/local/bin/mlflow-ensure-user "$MLFLOW_URI"

say "Ray worker"
docker run -d --name "$PREFIX-ray-worker" "${RAY_NODE[@]}" --env-file "$WORKER_ENV" "$IMAGE" \
    ray start --address="$HEAD_IP:$GCS_PORT" --block --node-ip-address="$WORKER_IP" \
    --num-cpus="${ENV[RAY_WORKER_CPUS]}" --object-store-memory="${ENV[RAY_OBJECT_STORE_BYTES]}" \
    --dashboard-agent-listen-port="$WORKER_AGENT_PORT" --disable-usage-stats >/dev/null
wait_until "$PREFIX-ray-worker" 180 "healthy" mtbert-healthcheck \
    "http://$WORKER_IP:$WORKER_AGENT_PORT/api/local_raylet_healthz"

# --------------------------------------------------------------------------- the sweep

say "mtbert sweep submit sweeps/smoke.yaml --smoke --address $DASHBOARD --workdir /shared/work --name $SWEEP"
start=$(date +%s)
RAY_AUTH_MODE=token RAY_AUTH_TOKEN=${ENV[RAY_AUTH_TOKEN]} \
    mtbert sweep submit sweeps/smoke.yaml --smoke --address "$DASHBOARD" --workdir /shared/work \
    --name "$SWEEP" 2>&1 | tee "$STATE/logs/sweep.log"
SWEEP_S=$(( $(date +%s) - start ))
JOB=$(sed -n 's/^submitted job \([^ ]*\) to .*/\1/p' "$STATE/logs/sweep.log")
say "mtbert sweep status $JOB --address $DASHBOARD"
RAY_AUTH_MODE=token RAY_AUTH_TOKEN=${ENV[RAY_AUTH_TOKEN]} \
    mtbert sweep status "$JOB" --address "$DASHBOARD" | tee "$STATE/logs/status.log"
grep -q ": SUCCEEDED" "$STATE/logs/status.log" || die "job $JOB did not SUCCEED"
say "mtbert sweep stop $JOB --address $DASHBOARD"
RAY_AUTH_MODE=token RAY_AUTH_TOKEN=${ENV[RAY_AUTH_TOKEN]} \
    mtbert sweep stop "$JOB" --address "$DASHBOARD" | tee "$STATE/logs/stop.log"
grep -q ": already ended" "$STATE/logs/stop.log" || die "job $JOB: stop did not find it ended"

# The other way docs/cluster.md gives: the driver run on the head itself, from the image's copy.
say "on the head: mtbert sweep run /app/sweeps/smoke.yaml --smoke --address auto --name $SWEEP-on-head"
start=$(date +%s)
docker exec -w /shared/work "$PREFIX-ray-head" \
    mtbert sweep run /app/sweeps/smoke.yaml --smoke --address auto --name "$SWEEP-on-head" \
    2>&1 | tee "$STATE/logs/sweep-on-head.log"
ON_HEAD_S=$(( $(date +%s) - start ))

say "checks against $MLFLOW_URI"
export MLFLOW_TRACKING_USERNAME=${ENV[MLFLOW_ADMIN_USERNAME]}
export MLFLOW_TRACKING_PASSWORD=${ENV[MLFLOW_ADMIN_PASSWORD]}
"$PYTHON" - "$MLFLOW_URI" "$WORKER_IP" "$SWEEP" "$SWEEP-on-head" <<'EOF'
import sys
from collections import Counter

from mlflow.tracking import MlflowClient

uri, worker_ip, *sweeps = sys.argv[1:]
client = MlflowClient(uri)
experiment = client.get_experiment_by_name("smoke-smoke")  # --smoke: `<experiment>-smoke`
assert experiment is not None, "no experiment 'smoke-smoke' on the server"
for sweep in sweeps:
    parents = client.search_runs([experiment.experiment_id],
                                 filter_string=f"tags.role = 'sweep' and attributes.run_name = '{sweep}'")
    assert len(parents) == 1, f"{len(parents)} parent runs named {sweep}"
    parent = parents[0]
    assert parent.info.status == "FINISHED", f"sweep {sweep}: {parent.info.status}"
    children = client.search_runs([experiment.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    keys = Counter(c.data.tags.get("trial_key") for c in children)
    twice = [k for k, n in keys.items() if n > 1]
    assert not twice, f"{sweep}: trials logged more than once: {twice}"
    assert len(children) == int(parent.data.tags["num_trials"]), \
        f"{sweep}: {len(children)} trial runs, {parent.data.tags['num_trials']} trials"
    for c in children:
        name = f"{sweep}/{c.info.run_name}"
        assert c.info.status == "FINISHED", f"{name}: {c.info.status}"
        missing = {"overall", "tm_relative_score", "train_time_s", "peak_memory_mb"} - set(c.data.metrics)
        assert not missing, f"{name}: no {sorted(missing)}"
        # Trials need a CPU, and only the worker has any.
        assert c.data.tags.get("node_ip") == worker_ip, f"{name} ran on {c.data.tags.get('node_ip')}"
        # Uploaded through the server onto the shared volume.
        assert client.list_artifacts(c.info.run_id), f"{name}: no artifacts"
    print(f"{sweep}: {len(children)} trials, each FINISHED once on the worker ({worker_ip}), "
          "with overall, tm_relative_score, time, memory and its artifacts")
EOF

say "mtbert leaderboard --experiment smoke-smoke --sweep $SWEEP --tracking-uri $MLFLOW_URI"
mtbert leaderboard --experiment smoke-smoke --sweep "$SWEEP" --tracking-uri "$MLFLOW_URI" \
    --output "$STATE/leaderboard.md"
cat "$STATE/leaderboard.md"
"$PYTHON" - "$STATE/leaderboard.md" "$MLFLOW_URI" "$SWEEP" <<'EOF'
import itertools
import sys

from mlflow.tracking import MlflowClient

table, uri, sweep = sys.argv[1:]
lines = itertools.dropwhile(lambda line: not line.startswith("|"), open(table))
rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines))[2:]  # past header, rule
client = MlflowClient(uri)
experiment = client.get_experiment_by_name("smoke-smoke")
parent = client.search_runs([experiment.experiment_id],
                            filter_string=f"tags.role = 'sweep' and attributes.run_name = '{sweep}'")[0]
assert len(rows) == int(parent.data.tags["num_trials"]), f"{len(rows)} leaderboard rows"
print(f"leaderboard: {len(rows)} rows, one per trial")
EOF

# --------------------------------------------------------------------------- summary

say "summary"
{
    printf 'docker %s, storage driver %s, base %s\n' "$(docker version -f '{{.Server.Version}}')" \
        "$(docker info -f '{{.Driver}}')" "$BASE"
    if [ -n "${BASE_S:-}" ]; then
        size=$(docker image inspect -f '{{.Size}}' "$BASE")
        printf '%-26s made in %4s s, %5s MB\n' "$BASE" "$BASE_S" $(( size / 1000000 ))
    fi
    for name in mtbert mlflow postgres; do
        case $name in mtbert) tag=$IMAGE ;; mlflow) tag=$MLFLOW_IMAGE ;; postgres) tag=$POSTGRES_IMAGE ;; esac
        size=$(docker image inspect -f '{{.Size}}' "$tag")
        printf '%-26s built in %4s s, %5s MB\n' "$tag" "${BUILD_S[$name]}" $(( size / 1000000 ))
    done
    printf 'sweep %s: submitted, run and followed in %s s\n' "$SWEEP" "$SWEEP_S"
    printf 'sweep %s-on-head: run on the head in %s s\n' "$SWEEP" "$ON_HEAD_S"
    grep "^sweep $SWEEP FINISHED" "$STATE/logs/sweep.log"
    printf 'smoke.sh: %s s in all\n' "$SECONDS"
} | tee "$STATE/summary.txt"
