"""Wiring of docker/ (compose, images, env file) and docker/kuberay/, read as data.

No Docker engine or Kubernetes API is needed: the files are parsed and their references
checked against each other (every ${VAR} documented, every secret a reference, every
long-running service health-checked, every volume declared and mounted, ...).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
KUBERAY = DOCKER / "kuberay"

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?message}, ${VAR?message}; $${...} is escaped.
VAR_REF = re.compile(r"(?<!\$)\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[-?])?(?P<arg>[^}]*)\}")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY|SECRET_KEY", re.I)
LONG_RUNNING = {"ray-head", "ray-worker", "postgres", "minio", "mlflow"}
ONE_SHOT = {"minio-init", "mlflow-init"}


def compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def env_example() -> dict[str, str]:
    out = {}
    for line in (DOCKER / ".env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def kuberay_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(KUBERAY.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def kind(name: str) -> dict[str, Any]:
    found = [d for d in kuberay_docs() if d.get("kind") == name]
    assert len(found) == 1, f"expected one {name}, found {len(found)}"
    return found[0]


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}[{i}]")
    else:
        yield path, node


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def flat_command(service: dict[str, Any]) -> str:
    command = service.get("command", "")
    return " ".join(command) if isinstance(command, list) else str(command)


# --------------------------------------------------------------------------- compose

def test_services_and_ports() -> None:
    services = compose()["services"]
    assert set(services) == LONG_RUNNING | ONE_SHOT
    ports = {name: [str(p) for p in s.get("ports", [])] for name, s in services.items()}
    # Published on the loopback interface only: the dashboard runs code, MLflow holds results.
    for name, published in ports.items():
        for mapping in published:
            assert mapping.startswith("127.0.0.1:"), f"{name}: {mapping} is published on every interface"
    assert any(p.endswith(":8265") for p in ports["ray-head"])
    assert any(p.endswith(":5000") for p in ports["mlflow"])
    head = flat_command(services["ray-head"])
    assert "ray start --head" in head and "--block" in head and "--dashboard-host=0.0.0.0" in head
    worker = flat_command(services["ray-worker"])
    assert "--address=ray-head:6379" in worker and "--block" in worker
    assert services["ray-worker"]["deploy"]["replicas"]  # scalable; --scale overrides
    assert "hostname" not in services["ray-worker"]  # scaled replicas must not share one


def test_long_running_services_have_health_checks_and_restart() -> None:
    services = compose()["services"]
    for name in LONG_RUNNING:
        check = services[name].get("healthcheck")
        assert check and check.get("test"), f"{name}: no healthcheck"
        assert services[name].get("restart") == "unless-stopped", name
    for name in ONE_SHOT:
        assert services[name].get("restart") == "no", name
    # Ray's health endpoints are the ones its dashboard serves without a token.
    assert "/api/gcs_healthz" in " ".join(services["ray-head"]["healthcheck"]["test"])
    assert "/api/local_raylet_healthz" in " ".join(services["ray-worker"]["healthcheck"]["test"])
    assert "http://localhost:5000/health" in services["mlflow"]["healthcheck"]["test"]


def test_start_order_waits_for_health_and_init_jobs() -> None:
    services = compose()["services"]
    needs = {name: {dep: spec["condition"] for dep, spec in s.get("depends_on", {}).items()}
             for name, s in services.items()}
    assert needs["mlflow"] == {"postgres": "service_healthy", "minio-init": "service_completed_successfully"}
    assert needs["minio-init"] == {"minio": "service_healthy"}
    assert needs["mlflow-init"] == {"mlflow": "service_healthy"}
    assert needs["ray-head"] == {"mlflow-init": "service_completed_successfully"}
    assert needs["ray-worker"] == {"ray-head": "service_healthy"}


def test_named_volumes_declared_and_used() -> None:
    doc = compose()
    declared = set(doc["volumes"])
    used: dict[str, set[str]] = {}
    for name, service in doc["services"].items():
        for mount in service.get("volumes", []):
            source, _, target = str(mount).partition(":")
            assert source in declared, f"{name}: {source} is a bind mount or undeclared volume"
            used.setdefault(source, set()).add(f"{name}:{target}")
    assert set(used) == declared, f"declared but unused: {declared - set(used)}"
    assert used["postgres"] == {"postgres:/var/lib/postgresql/data"}
    assert used["minio"] == {"minio:/data"}
    # One path on every Ray node: what makes data, models and runs/ visible to all trials.
    assert used["shared"] == {"ray-head:/shared", "ray-worker:/shared"}


def references(path: Path) -> list[re.Match]:
    """${...} references in the values of a compose file (compose does not read comments)."""
    doc = yaml.safe_load(path.read_text())
    return [m for _, value in walk(doc) if isinstance(value, str) for m in VAR_REF.finditer(value)]


def test_every_variable_reference_is_documented_in_env_example() -> None:
    documented = env_example()
    for path in (DOCKER / "compose.yaml", DOCKER / "compose.gpu.yaml"):
        refs = {m["name"] for m in references(path)}
        assert refs, path
        missing = refs - set(documented)
        assert not missing, f"{path.name}: {sorted(missing)} not in docker/.env.example"


def test_secrets_are_required_references_never_literals() -> None:
    text = (DOCKER / "compose.yaml").read_text()
    refs = [(m["name"], m["op"]) for m in references(DOCKER / "compose.yaml")]
    for service_name, service in compose()["services"].items():
        for key, value in environment(service).items():
            if not SECRET_NAME.search(key) or key == "RAY_AUTH_MODE":
                continue
            match = VAR_REF.fullmatch(value)
            assert match, f"{service_name}.{key}: literal value, must be a ${{VAR:?...}} reference"
            assert match["op"] == ":?", f"{service_name}.{key}: a secret must be required (:?), not defaulted"
    # No secret-named variable gets a default anywhere.
    for name, op in refs:
        if SECRET_NAME.search(name):
            assert op == ":?", f"${{{name}}} has a default or may be empty"
    # ... and nothing password-like sits in commands either.
    assert not re.search(r"(password|secret|token)\s*[=:]\s*[A-Za-z0-9]{6,}", text, re.I)


def test_env_example_has_blank_secrets_only() -> None:
    for key, value in env_example().items():
        if SECRET_NAME.search(key):
            assert value == "", f"docker/.env.example: {key} must be blank (a placeholder), not a value"
    assert (DOCKER / ".gitignore").read_text().splitlines().count(".env") == 1


def test_mlflow_uses_postgres_and_minio_with_auth() -> None:
    services = compose()["services"]
    mlflow = services["mlflow"]
    command = flat_command(mlflow)
    backend = re.search(r"--backend-store-uri[= ](\S+)", command)[1]
    assert backend.startswith("postgresql+psycopg2://postgres:5432/")  # the driver the image installs
    assert "@" not in backend  # credentials come from PGUSER / PGPASSWORD, not the command line
    assert re.search(r"--artifacts-destination[= ]s3://", command)
    assert "--serve-artifacts" in command and "--app-name=basic-auth" in command
    env = environment(mlflow)
    assert env["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    for key in ("PGUSER", "PGPASSWORD", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                "MLFLOW_AUTH_ADMIN_USERNAME", "MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        assert VAR_REF.fullmatch(env[key]), key
    # The Ray head reaches MLflow by service name: that Host header must be allowed.
    assert "mlflow:5000" in env["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")
    assert environment(services["ray-head"])["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    # Workers never log to MLflow, so they hold no MLflow credentials.
    assert not any(k.startswith("MLFLOW") for k in environment(services["ray-worker"]))
    # MLflow's S3 user is the one minio-init creates, not the MinIO root account.
    init = services["minio-init"]["command"][0]
    assert "mc mb --ignore-existing" in init and "mc admin user add" in init
    assert env["AWS_ACCESS_KEY_ID"] != environment(services["minio"])["MINIO_ROOT_USER"]


def test_ray_nodes_require_token_auth() -> None:
    services = compose()["services"]
    for name in ("ray-head", "ray-worker"):
        env = environment(services[name])
        assert env["RAY_AUTH_MODE"] == "token"
        assert VAR_REF.fullmatch(env["RAY_AUTH_TOKEN"])["op"] == ":?"


def test_basic_auth_ini_holds_no_credentials() -> None:
    text = (DOCKER / "mlflow" / "basic_auth.ini").read_text()
    assert "admin_password" not in text and "admin_username" not in text
    assert "database_uri = sqlite:////mlflow/auth/" in text  # on the mlflow-auth volume
    mounts = compose()["services"]["mlflow"]["volumes"]
    assert "mlflow-auth:/mlflow/auth" in mounts


# --------------------------------------------------------------------------- images

def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("name", ["Dockerfile", "mlflow.Dockerfile", "postgres.Dockerfile"])
def test_images_run_as_non_root(name: str) -> None:
    users = [rest for word, rest in dockerfile_instructions(DOCKER / name) if word == "USER"]
    # The last USER is the one containers run as.
    assert users and users[-1].split(":")[0] not in ("root", "0"), f"{name}: runs as root"


def test_project_image_installs_torch_per_build_arg_like_the_makefile() -> None:
    steps = dockerfile_instructions(DOCKER / "Dockerfile")
    args = {rest.split("=")[0] for word, rest in steps if word == "ARG"}
    assert {"TORCH_SPEC", "TORCH_INDEX"} <= args
    runs = [rest for word, rest in steps if word == "RUN"]
    torch_step = next(i for i, r in enumerate(runs) if "${TORCH_SPEC}" in r)
    assert "--index-url ${TORCH_INDEX}" in runs[torch_step]
    project_step = next(i for i, r in enumerate(runs) if "pip install" in r and "-e '.[test]'" in r)
    assert torch_step < project_step  # pinned torch first, as `make install` does
    # The Makefile's pin is the image's default.
    makefile_pin = re.search(r"^TORCH\s*\?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M)[1]
    assert f"ARG TORCH_SPEC={makefile_pin}" in (DOCKER / "Dockerfile").read_text()
    compose_args = compose()["services"]["ray-head"]["build"]["args"]
    assert set(compose_args) == {"TORCH_SPEC", "TORCH_INDEX"}


def test_build_contexts_never_carry_the_env_file() -> None:
    services = compose()["services"]
    for name, ignore in (("ray-head", "Dockerfile.dockerignore"), ("mlflow", "mlflow.Dockerfile.dockerignore")):
        build = services[name]["build"]
        assert (DOCKER / build["dockerfile"]).name + ".dockerignore" == ignore
        lines = (DOCKER / ignore).read_text().splitlines()
        assert "**/.env" in lines or lines[:1] == ["*"] or "*" in lines, ignore
    # docker/smoke.sh builds PostgreSQL from docker/ as its context too.
    lines = (DOCKER / "postgres.Dockerfile.dockerignore").read_text().splitlines()
    assert [line for line in lines if line and not line.startswith("#")] == ["*", "!postgres/"]
    project_ignore = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    assert {".venv", ".git", "runs", ".mtbert_cache"} <= set(project_ignore)


def test_mlflow_image_version_matches_the_client() -> None:
    import mlflow

    assert f"ARG MLFLOW_VERSION={mlflow.__version__}" in (DOCKER / "mlflow.Dockerfile").read_text()
    assert env_example()["MLFLOW_VERSION"] == mlflow.__version__


# --------------------------------------------------------------------------- KubeRay

def test_raycluster_head_and_workers() -> None:
    cluster = kind("RayCluster")
    spec = cluster["spec"]
    import ray

    assert spec["rayVersion"] == ray.__version__  # nodes must run the driver's Ray
    assert spec["authOptions"] == {"mode": "token", "secretName": "mtbert-secrets"}
    head = spec["headGroupSpec"]["template"]["spec"]
    groups = spec["workerGroupSpecs"]
    assert groups and all(g["replicas"] >= 1 and g["maxReplicas"] >= g["replicas"] for g in groups)
    for pod in [head] + [g["template"]["spec"] for g in groups]:
        assert pod["securityContext"]["runAsNonRoot"] is True
        container = pod["containers"][0]
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["exec"]["command"][0] == "mtbert-healthcheck"
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["shared"] == "/shared"
        claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]}
        assert claims["shared"] == kind("PersistentVolumeClaim")["metadata"]["name"]
    assert kind("PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteMany"]


def secret_refs(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(env name, secret name, key) of every env var read from a Secret."""
    out = []
    for path, value in walk(doc):
        if path.endswith(".valueFrom.secretKeyRef.name"):
            env_path = path[: -len(".valueFrom.secretKeyRef.name")]
            entry = doc
            for part in re.findall(r"\.([^.\[]+)|\[(\d+)\]", env_path):
                entry = entry[part[0]] if part[0] else entry[int(part[1])]
            out.append((entry["name"], value, entry["valueFrom"]["secretKeyRef"]["key"]))
    return out


def test_rayjob_runs_the_smoke_sweep_with_secret_references() -> None:
    job = kind("RayJob")
    cluster = kind("RayCluster")
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    entry = job["spec"]["entrypoint"]
    assert "mtbert sweep run /app/sweeps/smoke.yaml" in entry
    assert '--tracking-uri "$MLFLOW_TRACKING_URI"' in entry
    assert (ROOT / "sweeps" / "smoke.yaml").is_file()
    # The whole command is one quoted argument: the submitter's shell must not split it at &&.
    assert entry.startswith("bash -c '") and entry.endswith("'") and entry.count("'") == 2
    secret = yaml.safe_load((KUBERAY / "secret.example.yaml").read_text())
    keys = set(secret["stringData"])
    refs = secret_refs(job) + secret_refs(cluster)
    by_env = {env: (name, key) for env, name, key in refs}
    assert by_env["MLFLOW_TRACKING_URI"] == ("mtbert-secrets", "mlflow-tracking-uri")
    assert by_env["MLFLOW_TRACKING_USERNAME"][1] == "mlflow-username"
    assert by_env["MLFLOW_TRACKING_PASSWORD"][1] == "mlflow-password"
    assert by_env["RAY_AUTH_TOKEN"] == ("mtbert-secrets", "auth_token")
    assert {name for _, name, _ in refs} == {secret["metadata"]["name"]}
    assert {key for _, _, key in refs} <= keys


def test_manifests_hold_no_literal_secret_values() -> None:
    for doc in kuberay_docs():
        if doc["kind"] == "Secret":
            # The example holds placeholders only.
            assert all(re.fullmatch(r"<[^>]+>", v) for v in doc["stringData"].values())
            continue
        for path, value in walk(doc):
            if path.endswith(".name") and isinstance(value, str) and SECRET_NAME.search(value):
                env = path[: -len(".name")]
                values = dict(walk(doc))
                assert f"{env}.value" not in values, f"{doc['kind']}{env}: literal secret value"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomization_renders_with_one_image_override() -> None:
    out = subprocess.run(["kubectl", "kustomize", str(KUBERAY)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert {d["kind"] for d in rendered} == {"RayCluster", "RayJob", "PersistentVolumeClaim"}
    images = {v for d in rendered for p, v in walk(d) if p.endswith(".image")}
    assert images == {"mtbert:cpu"}


@pytest.mark.parametrize("name", ["Dockerfile", "mlflow.Dockerfile", "postgres.Dockerfile"])
def test_image_run_steps_are_valid_shell(name: str) -> None:
    for word, rest in dockerfile_instructions(DOCKER / name):
        if word == "RUN":
            script = re.sub(r"^(--\S+\s+)+", "", rest)  # BuildKit's RUN flags (--mount=...) are no shell
            out = subprocess.run(["/bin/sh", "-n", "-c", script], capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, f"{name}: RUN {rest[:60]}...: {out.stderr}"


def test_image_requirements_step_reads_the_project_dependencies(tmp_path: Path) -> None:
    """The Dockerfile's dependency step, executed by a shell on this pyproject.toml."""
    step = next(rest for word, rest in dockerfile_instructions(DOCKER / "Dockerfile")
                if word == "RUN" and "tomllib" in rest)
    # pyproject.toml reaches the step through a BuildKit bind mount (no layer of its own); here
    # a copy in the working folder stands in for it, and the list is made but not installed.
    mount = re.match(r"--mount=(\S+)\s+", step)
    assert mount, "the dependency step reads pyproject.toml through a bind mount"
    options = dict(kv.split("=", 1) for kv in mount[1].split(","))
    assert options["type"] == "bind" and options["source"] == "pyproject.toml"
    listing, install = step[mount.end():].split(" && pip install ", 1)
    assert install.startswith("-r /tmp/requirements.txt")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    ray_version = re.search(r"^ARG RAY_VERSION=(\S+)$", (DOCKER / "Dockerfile").read_text(), re.M)[1]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "RAY_VERSION": ray_version}
    listing = listing.replace(options["target"], "pyproject.toml").replace("/tmp/requirements.txt", "requirements.txt")
    out = subprocess.run(["/bin/sh", "-c", listing],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    wanted = (tmp_path / "requirements.txt").read_text().split()
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert wanted == project["dependencies"] + project["optional-dependencies"]["test"] + [f"ray[default]=={ray_version}"]
    import ray

    assert ray_version == ray.__version__ == kind("RayCluster")["spec"]["rayVersion"]  # one Ray everywhere


def test_torch_step_picks_the_index_from_the_build_arg(tmp_path: Path) -> None:
    step = next(rest for word, rest in dockerfile_instructions(DOCKER / "Dockerfile")
                if word == "RUN" and "${TORCH_SPEC}" in rest)
    fake_pip = tmp_path / "pip"
    fake_pip.write_text('#!/bin/sh\necho "$@"\n')
    fake_pip.chmod(0o755)
    for index, expected in (("https://download.pytorch.org/whl/cu128",
                             "install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"),
                            ("", "install torch==2.13.0")):
        env = {"PATH": f"{tmp_path}{os.pathsep}/usr/bin:/bin", "TORCH_SPEC": "torch==2.13.0", "TORCH_INDEX": index}
        out = subprocess.run(["/bin/sh", "-c", step], env=env, capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == expected
