"""orchestration.run.remote without a cluster: which config paths the node check asks about.
(The checks themselves run on a real two-node cluster in test_two_node_cluster.py.)"""
from __future__ import annotations

from orchestration.run.remote import input_paths, node_label


def test_input_paths_follow_the_data_source() -> None:
    configs = [
        {"data": {"source": "cs224n", "dir": "/shared/data/minbert", "cache_dir": "/shared/work/cache"},
         "model": {"name_or_path": "/shared/models/minilm"}},
        {"data": {"source": "files", "dir": "/ignored/for/files",
                  "files": {"sst": {"train": "/d/sst-train.csv", "dev": "/d/sst-dev.csv"},
                            "sts": {"train": "/d/sts-train.csv"}}},
         "model": {"name_or_path": "bert-base-uncased"}},  # a hub id: nothing on disk
        {"data": {"source": "synthetic", "dir": "/not/read"}, "model": {"name_or_path": "tiny"}},
    ]
    assert input_paths(configs) == {
        "data.dir": "/shared/data/minbert",
        "model.name_or_path": "/shared/models/minilm",
        "data.files.sst.train": "/d/sst-train.csv",
        "data.files.sst.dev": "/d/sst-dev.csv",
        "data.files.sts.train": "/d/sts-train.csv",
    }  # outputs (cache_dir) are created, not checked


def test_input_paths_keep_every_distinct_path_once() -> None:
    configs = [{"data": {"source": "cs224n", "dir": "/a"}, "model": {"name_or_path": "/m1"}},
               {"data": {"source": "cs224n", "dir": "/a"}, "model": {"name_or_path": "/m2"}},
               {"data": {"source": "cs224n", "dir": "/b"}, "model": {"name_or_path": "/m1"}}]
    assert input_paths(configs) == {"data.dir": "/a", "model.name_or_path": "/m1",
                                    "model.name_or_path #2": "/m2", "data.dir #2": "/b"}


def test_node_label_names_host_ip_and_id() -> None:
    node = {"NodeManagerHostname": "worker-1", "NodeManagerAddress": "10.0.0.3", "NodeID": "3f2a9c1b" + "0" * 48}
    assert node_label(node) == "worker-1 (10.0.0.3, 3f2a9c1b)"
