"""Create the MLflow user the Ray nodes log as, or reset its password: the env file stays the
one source of truth, so re-running it (every `docker compose up`) is harmless.

Authenticates as the admin through MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD.

    python ensure_user.py http://mlflow:5000   # user from MLFLOW_SWEEP_USERNAME / _PASSWORD
"""
from __future__ import annotations

import os
import sys


def ensure_user(tracking_uri: str, username: str, password: str) -> str:
    """'created' or 'updated'."""
    from mlflow.exceptions import RestException
    from mlflow.server.auth.client import AuthServiceClient

    client = AuthServiceClient(tracking_uri)
    try:
        client.create_user(username, password)
        return "created"
    except RestException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    client.update_user_password(username, password)
    return "updated"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: ensure_user.py TRACKING_URI", file=sys.stderr)
        return 2
    missing = [v for v in ("MLFLOW_SWEEP_USERNAME", "MLFLOW_SWEEP_PASSWORD",
                           "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD") if not os.environ.get(v)]
    if missing:
        print(f"ensure_user: set {', '.join(missing)}", file=sys.stderr)
        return 2
    username = os.environ["MLFLOW_SWEEP_USERNAME"]
    what = ensure_user(argv[0], username, os.environ["MLFLOW_SWEEP_PASSWORD"])
    print(f"MLflow user {username} {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
