"""What `mtbert predict --model` accepts besides a bundle folder: the names a sweep prints.

    runs/<sweep>/<trial>/output/best     a bundle folder (used as it is; a trial's links into its checkpoint)
    models:/m-0123...  models:/NAME/3    an MLflow model URI (what a sweep prints, or the registry's)
    models:/NAME@champion                 a registry alias
    runs:/<run id>/<path>                 a model stored as a run's artifact
    <run id>                              32 hex digits: the model that run logged
    NAME                                  a registered model: its latest version

A logged model carries the bundle as its `bundle` artifact; it is downloaded once into
`<cache>/models/<digest of the URI and store>` and loaded from there like any bundle folder.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from orchestration.errors import SweepError
from orchestration.paths import fluent_tracking_uri

RUN_ID = re.compile(r"[0-9a-f]{32}")
CACHE = Path(".mtbert_cache")


def model_uri(ref: str, tracking_uri: str) -> str:
    """The MLflow model URI a --model reference names (a registered name: its latest version)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    if ref.startswith(("models:/", "runs:/")):
        return ref
    client = MlflowClient(tracking_uri)
    if RUN_ID.fullmatch(ref):
        try:
            run = client.get_run(ref)
            logged = client.search_logged_models([run.info.experiment_id], f"source_run_id = '{ref}'")
        except MlflowException as exc:
            raise SweepError(f"--model {ref}: {str(exc).splitlines()[0]} (store {tracking_uri})") from None
        if not logged:
            raise SweepError(f"--model {ref}: run {ref} logged no model (a sweep logs the best trial's; "
                             "tracking.log_models: all logs every trial's)")
        return f"models:/{logged[0].model_id}"
    try:
        versions = client.search_model_versions(f"name = '{ref}'")
    except MlflowException as exc:
        raise SweepError(f"--model {ref}: cannot read the model registry of {tracking_uri}: "
                         f"{str(exc).splitlines()[0]}") from None
    if not versions:
        raise SweepError(f"--model {ref}: neither a folder nor a registered model in {tracking_uri} "
                         "(give a bundle folder, a models:/ URI, a run id or a registered name)")
    return f"models:/{ref}/{max(int(v.version) for v in versions)}"


def resolve_bundle(ref: str, tracking_uri: str, cache: Path = CACHE) -> Path:
    """A local bundle folder for `ref`: the folder itself, or the logged model's bundle
    artifact, downloaded once."""
    if Path(ref).exists():
        return Path(ref)
    import mlflow
    from mlflow.exceptions import MlflowException

    uri = model_uri(ref, tracking_uri)
    folder = cache / "models" / hashlib.blake2b(f"{tracking_uri}|{uri}".encode(), digest_size=12).hexdigest()
    found = _bundle_in(folder)
    if found is not None:
        return found
    try:
        # models:/ URIs resolve through the process-wide store, whatever tracking_uri= says.
        with fluent_tracking_uri(tracking_uri):
            mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(folder))
    except MlflowException as exc:
        raise SweepError(f"--model {ref}: {str(exc).splitlines()[0]} (store {tracking_uri})") from None
    found = _bundle_in(folder)
    if found is None:
        raise SweepError(f"--model {ref}: {uri} is not an mtbert model (no bundle artifact inside)")
    return found


def _bundle_in(folder: Path) -> Path | None:
    """The bundle a logged model carries (its pyfunc `artifacts/` keeps the folder's own name)."""
    marks = sorted((folder / "artifacts").glob("*/bundle.json")) if folder.is_dir() else []
    return marks[0].parent if marks else None
