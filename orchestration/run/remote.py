"""Checks that run ON every Ray node before a sweep starts its trials.

A trial may land on any node, and every path in its config was made absolute on the driver
(orchestration/paths.py). On a cluster that path has to mean the same thing on every node:
the data and a local model must be visible there (a volume every node mounts), and Ray Tune's
storage folder must be one shared folder, not a same-named local one per node (Tune then
fails the first checkpoint a remote trial reports, minutes into the sweep). Both are asked of
each node by a tiny task pinned to it, so the answer comes from the node itself.

Call them after ray.init and before Tuner.fit:

    check_paths_on_nodes(input_paths(trial_configs))
    check_shared_storage(storage_dir)
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestration.errors import SweepError

ANSWER_TIMEOUT_S = 120.0  # a node must start one worker process (and its runtime env) in this time
MARKER_PREFIX = ".mtbert-shared-check-"


class NodePathError(SweepError):
    """A path a trial needs is not visible (or not the same folder) on some Ray node."""


def _alive_nodes() -> list[dict[str, Any]]:
    import ray

    if not ray.is_initialized():
        raise RuntimeError("connect to the Ray cluster (ray.init) before checking its nodes")
    return [n for n in ray.nodes() if n.get("Alive")]


def node_label(node: Mapping[str, Any]) -> str:
    """`worker-1 (10.0.0.3, 3f2a9c1b)`: host, IP and short node id, since several nodes can
    share a host name or an IP (containers, or many nodes on one machine)."""
    host = node.get("NodeManagerHostname") or "?"
    return f"{host} ({node.get('NodeManagerAddress', '?')}, {str(node.get('NodeID', ''))[:8]})"


def _on_every_node(probe, *args: Any) -> list[tuple[dict[str, Any], Any]]:
    """Run `probe(*args)` once on each alive node; [(node, answer)]. Zero CPUs asked, so a
    node whose CPUs are all busy (or a head started with --num-cpus 0) still answers."""
    import ray
    from ray.exceptions import GetTimeoutError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = _alive_nodes()
    remote = ray.remote(num_cpus=0, max_retries=0)(probe)
    refs = [remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(*args) for n in nodes]
    try:
        answers = ray.get(refs, timeout=ANSWER_TIMEOUT_S)
    except GetTimeoutError:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        silent = [node_label(n) for n, ref in zip(nodes, refs) if ref not in ready]
        raise NodePathError(f"node(s) {', '.join(silent)} did not answer the path check within "
                            f"{ANSWER_TIMEOUT_S:.0f}s; is every node healthy (`ray status`)?") from None
    return list(zip(nodes, answers))


def _labelled(paths: Sequence[str] | Mapping[str, str]) -> dict[str, str]:
    if isinstance(paths, Mapping):
        return {str(label): str(path) for label, path in paths.items()}
    return {str(path): str(path) for path in paths}


def check_paths_on_nodes(paths: Sequence[str] | Mapping[str, str]) -> None:
    """Every path must exist on every alive node of the connected cluster. `paths` is a list
    of paths or {label: path} (e.g. {"data.dir": "/shared/data/minbert"}), and the label names
    the config key in the error: `node worker-1 (10.0.0.3, 3f2a9c1b) cannot see data.dir
    /shared/data/minbert`."""
    labelled = _labelled(paths)
    if not labelled:
        return

    def missing_here(paths: dict[str, str]) -> list[str]:
        # Nested, so Ray ships it by value: the node needs nothing of this project to run it.
        return [label for label, path in paths.items() if not os.path.exists(path)]

    problems = []
    for node, missing in _on_every_node(missing_here, labelled):
        if missing:
            shown = [label if label == labelled[label] else f"{label} {labelled[label]}" for label in missing]
            problems.append(f"node {node_label(node)} cannot see {', '.join(shown)}")
    if problems:
        raise NodePathError(f"{'; '.join(problems)}: put data and models on a volume mounted at the "
                            "same path on every node (docs/cluster.md)")


def check_shared_storage(folder: str | Path) -> None:
    """`folder` (Ray Tune's storage) must be ONE folder seen by every node: the driver writes a
    random marker into it and each node must read the same text back. A same-named local
    folder on a node fails here instead of at that node's first checkpoint."""
    def read_marker(path: str) -> str | None:
        """The marker's text; "" when the folder exists without it; None without the folder."""
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return "" if os.path.isdir(os.path.dirname(path)) else None

    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    marker = folder / f"{MARKER_PREFIX}{token}"
    marker.write_text(token)
    try:
        answers = _on_every_node(read_marker, str(marker))
    finally:
        marker.unlink(missing_ok=True)
    for node, seen in answers:
        if seen != token:
            why = "does not have that folder" if seen is None else "has a different folder there"
            raise NodePathError(f"node {node_label(node)} {why}: the sweep storage {folder} must be "
                                "shared by every node; put it on a shared volume (sweep run --storage, "
                                "sweep submit --workdir; docs/cluster.md)")


def _add(found: dict[str, str], label: str, path: str) -> None:
    """One entry per distinct path; a second path under the same key gets a numbered label."""
    if path in found.values():
        return
    n, key = 1, label
    while key in found:
        n += 1
        key = f"{label} #{n}"
    found[key] = path


def input_paths(configs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """{label: absolute path} of what nested trial configs (as the sweep plans them, paths
    already absolute) read from disk: data.dir (cs224n), data.files.<task>.train/dev (files)
    and a local model.name_or_path. Synthetic data and a hub model id add nothing."""
    found: dict[str, str] = {}
    for config in configs:
        data = config.get("data") or {}
        source = data.get("source", "synthetic")
        if source == "cs224n" and isinstance(data.get("dir"), str):
            _add(found, "data.dir", data["dir"])
        if source == "files":
            for task, entry in (data.get("files") or {}).items():
                for key in ("train", "dev"):
                    if isinstance(entry, Mapping) and isinstance(entry.get(key), str):
                        _add(found, f"data.files.{task}.{key}", entry[key])
        name = (config.get("model") or {}).get("name_or_path")
        if isinstance(name, str) and os.path.isabs(name):
            _add(found, "model.name_or_path", name)
    return found


__all__ = ["check_paths_on_nodes", "check_shared_storage", "input_paths", "node_label", "NodePathError"]
