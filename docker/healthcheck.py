#!/usr/bin/env python3
"""Container health check: exit 0 when every URL answers HTTP 200, else 1 with the reason.

    mtbert-healthcheck http://localhost:8265/api/gcs_healthz http://localhost:52365/api/local_raylet_healthz

Python and not curl/wget: the slim images have neither, and KubeRay's default probes call wget,
so the manifests name this script instead.
"""
from __future__ import annotations

import sys
import urllib.error
import urllib.request

TIMEOUT_S = 5.0


def check(url: str) -> str | None:
    """None when healthy, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as reply:
            return None if reply.status == 200 else f"HTTP {reply.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))


def main(urls: list[str]) -> int:
    if not urls:
        print("usage: mtbert-healthcheck URL [URL ...]", file=sys.stderr)
        return 2
    for url in urls:
        problem = check(url)
        if problem is not None:
            print(f"unhealthy: {url}: {problem}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
