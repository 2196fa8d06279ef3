"""Inter-task affinity telemetry (mtbert/train/affinity.py) on a planted case, and the grouping
it suggests (mtbert/train/grouping.py).

The planted case: three similarity tasks scored by the cosine of their two sentence vectors
(no output layer of their own to absorb a sign), two with the synthetic data's labels (the
same signal) and one with them mirrored (data.synthetic.mirrored: the opposite answer on the
same kind of inputs). Whatever helps `near` helps `close`, and hurts `far`.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from mtbert.cli import main
from mtbert.config import ConfigError, build_config
from mtbert.train import grouping as gr
from mtbert.train.loop import train
from mtbert.train.state import CHECKPOINT_STATE

PLANTED = ("near", "close", "far")
# The planted tasks as a `plugins:` module (a sweep's trials import it); registered here too.
PLANTED_PLUGIN = """
from mtbert.tasks import TaskSpec, register_task

for name in ("near", "close", "far"):  # registering the same spec again is a no-op
    register_task(TaskSpec(name=name, kind="regression", label_range=(0.0, 1.0), metric_name=f"{name}_corr",
                           pair=True, description="a planted similarity task"))
"""
exec(PLANTED_PLUGIN)

TINY = {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64}


def planted_base(cache: Path) -> dict:
    """The planted case, every task at every step (tuple). The first measurements see the tasks
    agree on lowering every pair's cosine (a random encoder scores every pair alike, above the
    labels' mean); the conflict shows once that is learnt, so the second epoch is read."""
    return {"tasks": list(PLANTED),
            "model": {"name_or_path": "tiny", "tiny": TINY, "max_length": 32},
            "data": {"synthetic": {"train_size": 160, "dev_size": 32, "mirrored": ["far"]}, "cache_dir": str(cache)},
            "pairs": {"encoding": "bi"}, "task_options": {t: {"head": "cosine"} for t in PLANTED},
            "optim": {"lr": 2e-3}, "sampling": {"strategy": "tuple", "steps_per_epoch": 10},
            "train": {"epochs": 2, "batch_size": 16, "device": "cpu"},
            "affinity": {"every_steps": 5}}


def planted(cache: Path, **extra) -> dict:
    return build_config(planted_base(cache), extra)


def read(folder: Path) -> dict:
    return json.loads((folder / gr.FOLDER / gr.JSON_FILE).read_text())


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("planted") / "out"
    result = train(planted(out.parent / "cache"), output_dir=out, log=None)
    return out, result


def test_planted_affinity_marks_the_shared_pair_positive_and_the_conflict_negative(planted_run):
    out, _ = planted_run
    doc = read(out)
    assert doc["measured"] == 4  # every 5 of 2 x 10 steps
    z = gr.affinities(doc["epochs"]["2"])
    assert z[("near", "close")] > 0 and z[("close", "near")] > 0, z
    for pair in (("near", "far"), ("far", "near"), ("close", "far"), ("far", "close")):
        assert z[pair] < 0, (pair, z)
    cosine = doc["epochs"]["2"]
    assert cosine["cosine/near-close"] > 0 > max(cosine["cosine/near-far"], cosine["cosine/close-far"]), cosine
    # Each measurement is a point at the run's global step; each epoch has its heatmap.
    assert [s for s, _ in doc["points"]["affinity/near-to-close"]] == [5, 10, 15, 20]
    assert sorted(p.name for p in (out / gr.FOLDER).glob("*.png")) == ["epoch-1.png", "epoch-2.png"]


def test_the_suggestion_names_the_planted_grouping(planted_run, tmp_path, monkeypatch, capsys):
    out, _ = planted_run
    doc = read(out)
    z = gr.affinities(gr.mean_over_epochs({int(e): m for e, m in doc["epochs"].items()}))
    assert gr.best_grouping(PLANTED, z)[1] == (("near", "close"), ("far",))
    fragment = tmp_path / "grouping.yaml"
    assert main(["affinity", str(out), "--output", str(fragment)]) == 0
    printed = capsys.readouterr().out
    assert "suggested: {near, close} | {far}" in printed, printed
    spec = yaml.safe_load(fragment.read_text())
    assert spec["space"]["sharing.head_share_tasks"]["values"] == [["near", "close"], None]
    assert "affinity" not in spec["base"]  # the telemetry is off in the sweep it suggests
    assert fragment.with_suffix(".png").is_file()
    from orchestration.sweep.load import load_sweep

    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(fragment)  # a sweep mtbert runs as written
    assert sweep.name == "grouping"


# Dropout everywhere and random task draws: a measurement that drew from a generator would show.
NOISY = {"sampling.strategy": "proportional", "sampling.steps_per_epoch": 6, "train.epochs": 3,
         "data.synthetic.train_size": 120, "data.synthetic.dev_size": 40, "train.device": "cpu",
         "heads.dropout": 0.3, "model.max_length": 32, "train.batch_size": 8, "sharing.head_regime": "S-I"}
MEASURED = ("time", "memory", "seq_per_s", "tokens_per_s", "mfu", "flops")


def repeatable(epochs: list[dict]) -> list[dict]:
    return [{k: v for k, v in e.items() if not any(m in k for m in MEASURED)} for e in epochs]


def test_telemetry_changes_nothing_the_run_trains_and_its_cost_is_counted(tmp_path):
    off = train(build_config({}, {**NOISY, "data.cache_dir": str(tmp_path / "cache")}), log=None)
    on = train(build_config({}, {**NOISY, "data.cache_dir": str(tmp_path / "cache"), "affinity.every_steps": 4}),
               output_dir=tmp_path / "on", log=None)
    assert repeatable(on.epochs) == repeatable(off.epochs)  # to the digit: equality, not a tolerance
    doc = read(tmp_path / "on")
    assert doc["measured"] == 4 and doc["flops"] > 0  # at global steps 4, 8, 12, 16 of 18
    # S-I shares the first head layer: the encoder and the shared head layer are measured apart
    # too, and each of the two shared encoder layers alone (what ranks the encoder depths).
    assert {gr.parse_name(n)[1] for n in doc["epochs"]["1"]} == {gr.WHOLE, gr.ENCODER, gr.HEADS,
                                                                 gr.encoder_layer(1), gr.encoder_layer(2)}
    # The measurement's FLOPs, and nothing else, are added to the run's compute.
    assert on.metrics["train_flops"] - off.metrics["train_flops"] == doc["flops"]
    # One measurement: a held batch of every task (a proportional step trains one), 1 + 3 x 5
    # forwards (3 tasks; the shared set, its encoder, its head layer, each encoder layer) and 3
    # backwards of it.
    per_step = off.metrics["train_flops"] / 18
    assert 10 * per_step < doc["flops"] / 4 < 50 * per_step


def test_resume_keeps_the_series_exact(tmp_path):
    cfg = build_config({}, {**NOISY, "data.cache_dir": str(tmp_path / "cache"), "affinity.every_steps": 4})
    straight: list[dict] = []
    train(cfg, reporter=lambda m, c: straight.append(m), output_dir=tmp_path / "straight", log=None)

    reports: list[dict] = []
    kept = tmp_path / "ckpt"

    class Stop(Exception):
        pass

    def stop_after_first(metrics, checkpoint_dir):
        reports.append(metrics)
        shutil.copytree(checkpoint_dir, kept)
        raise Stop

    with pytest.raises(Stop):
        train(cfg, reporter=stop_after_first, output_dir=tmp_path / "resumed", log=None)
    assert torch.load(kept / CHECKPOINT_STATE, weights_only=False)["affinity"]["epochs"]  # it rides the checkpoint
    train(cfg, reporter=lambda m, c: reports.append(m), output_dir=tmp_path / "resumed", resume_from=kept, log=None)

    def series(report: dict) -> dict:
        return ({k: v for k, v in report.items() if k.startswith(("affinity/", "cosine/"))},
                {k: v for k, v in report["step_losses"].items() if k.startswith(("affinity/", "cosine/"))})

    assert [series(r) for r in reports] == [series(r) for r in straight]
    assert series(straight[-1])[0] and series(straight[0])[1]
    assert read(tmp_path / "resumed") == read(tmp_path / "straight")


# --------------------------------------------------------------------------- the grouping

def test_partitions_are_every_set_partition():
    bell = [1, 1, 2, 5, 15, 52, 203, 877]
    for n, count in enumerate(bell):
        found = {gr.canonical(p, "abcdefg"[:n]) for p in gr.partitions(list("abcdefg"[:n]))}
        assert len(found) == count


def blocks(groups: list[list[str]], inside: float = 0.2, across: float = -0.1) -> gr.Affinities:
    block = {t: k for k, g in enumerate(groups) for t in g}
    return {(i, j): inside if block[i] == block[j] else across for i in block for j in block if i != j}


def test_the_search_finds_planted_blocks_exhaustively_and_by_beam():
    small = [["a", "b"], ["c", "d", "e"], ["f"]]
    assert gr.best_grouping("abcdef", blocks(small))[1] == (("a", "b"), ("c", "d", "e"), ("f",))
    big = [list("abcd"), list("efg"), list("hij"), list("kl")]  # 12 tasks: beyond EXHAUSTIVE, the beam search
    tasks = "abcdefghijkl"
    assert len(tasks) > gr.EXHAUSTIVE
    assert gr.best_grouping(tasks, blocks(big))[1] == tuple(tuple(g) for g in big)


def test_the_beam_search_matches_the_exhaustive_one_where_both_run():
    import random

    rng = random.Random(0)
    tasks = list("abcdefg")
    for _ in range(5):
        z = {(i, j): rng.uniform(-1, 1) for i in tasks for j in tasks if i != j}
        exhaustive = max(gr.score(p, z) for p in gr.partitions(tasks))
        assert max(gr.score(p, z) for p in gr.beam_partitions(tasks, z)) == pytest.approx(exhaustive)


def test_only_one_multi_task_group_maps_to_the_sharing_keys():
    z = blocks([["a", "b"], ["c", "d"]])
    assert gr.best_grouping("abcd", z)[1] == (("a", "b"), ("c", "d"))
    score, runnable = gr.expressible("abcd", z)
    assert runnable in ((("a", "b"), ("c",), ("d",)), (("a",), ("b",), ("c", "d"))) and score == pytest.approx(0.4)
    assert gr.sharing_keys((("a", "b"), ("c",), ("d",)), "abcd", 3) == {
        "sharing.head_regime": "S-S-S", "sharing.head_share_tasks": ["a", "b"]}
    assert gr.sharing_keys((("a", "b", "c", "d"),), "abcd", 0) == {
        "sharing.head_regime": "S", "sharing.head_share_tasks": None}
    with pytest.raises(ValueError, match="two groups of several tasks"):
        gr.sharing_keys((("a", "b"), ("c", "d")), "abcd", 3)


def test_series_names_are_mlflow_names_and_parse_back():
    for kind, part in ((gr.AFFINITY, gr.WHOLE), (gr.COSINE, gr.ENCODER), (gr.AFFINITY, gr.HEADS)):
        name = gr.series_name(kind, "sst", "para", part)
        assert re.fullmatch(r"[/\w.\- ]+", name), name  # MLflow's metric name characters
        assert gr.parse_name(name) == (kind, part, "sst", "para")
    assert gr.parse_name("loss_sst") is None and gr.parse_name("affinity/sst") is None


@pytest.mark.parametrize("key, value, message", [
    ("affinity.every_steps", -1, "affinity.every_steps: must be >= 0 (0 = off), got -1"),
    ("affinity.lookahead_lr", 0, "affinity.lookahead_lr: must be > 0 (or null for the optimizer's), got 0"),
    ("data.synthetic.mirrored", ["stt"], "data.synthetic.mirrored.stt: 'stt' is not one of tasks"),
])
def test_bad_affinity_settings_fail_at_load(key, value, message):
    with pytest.raises(ConfigError, match="^" + re.escape(f"config: {message}")):
        build_config({}, {key: value})


def test_one_task_has_no_affinity():
    with pytest.raises(ConfigError, match="affinity.every_steps: affinity is between tasks"):
        build_config({"tasks": ["sst"]}, {"affinity.every_steps": 5})


def test_each_shared_head_layer_is_measured_alone_and_ranks_the_regimes(tmp_path):
    # A frozen encoder under S-S-S: every shared parameter is a head layer, so the parts are the
    # whole set and each of its three layers (no encoder part, and no heads part equal to the whole).
    cfg = build_config({}, {**NOISY, "data.cache_dir": str(tmp_path / "cache"), "affinity.every_steps": 6,
                            "freeze.layers": -1, "sharing.head_regime": "S-S-S"})
    train(cfg, output_dir=tmp_path / "out", log=None)
    means = read(tmp_path / "out")["epochs"]["1"]
    layers = [gr.head_layer(k) for k in (1, 2, 3)]
    assert {gr.parse_name(n)[1] for n in means} == {gr.WHOLE, *layers}
    scores = gr.regime_scores(means, cfg.tasks, 3)
    per_layer = [gr.score([cfg.tasks], gr.affinities(means, part)) for part in layers]
    assert len(scores) == 8 and scores["I-I-I"] == 0.0
    assert scores["S-I-S"] == pytest.approx(per_layer[0] + per_layer[2])
    assert scores["S-S-S"] == pytest.approx(sum(per_layer))
    assert gr.regime_scores(means, cfg.tasks, 4) is None  # a fourth layer was not measured


def test_regime_scores_add_the_layers_a_regime_shares():
    help_, hurt = blocks([["a", "b"]]), {pair: -v for pair, v in blocks([["a", "b"]]).items()}
    means = {gr.series_name(gr.AFFINITY, i, j, gr.head_layer(k)): v
             for k, z in ((1, help_), (2, hurt)) for (i, j), v in z.items()}
    scores = gr.regime_scores(means, ["a", "b"], 2)
    assert max(scores, key=scores.get) == "S-I" and min(scores, key=scores.get) == "I-S"
    assert scores["I-I"] == 0.0 and scores["S-S"] == pytest.approx(0.0)


def test_depth_scores_add_the_encoder_layers_a_depth_shares(tmp_path):
    # Planted: the tasks help each other in the bottom layer and hurt each other in the second,
    # so sharing one layer ranks first and sharing none beats sharing both only by the sign.
    help_, hurt = blocks([["a", "b"]]), {pair: -2 * v for pair, v in blocks([["a", "b"]]).items()}
    means = {gr.series_name(gr.AFFINITY, i, j, gr.encoder_layer(k)): v
             for k, z in ((1, help_), (2, hurt)) for (i, j), v in z.items()}
    scores = gr.depth_scores(means, ["a", "b"], 2)
    assert scores[0] == 0.0 and max(scores, key=scores.get) == 1 and scores[2] < scores[0]
    assert gr.depth_scores(means, ["a", "b"], 3) is None  # a third layer was not measured
    # From a real run: a fine-tuned tiny encoder shares both its layers, each measured alone.
    cfg = build_config({}, {**NOISY, "data.cache_dir": str(tmp_path / "cache"), "affinity.every_steps": 6})
    train(cfg, output_dir=tmp_path / "out", log=None)
    run = read(tmp_path / "out")["epochs"]["1"]
    per_layer = [gr.score([cfg.tasks], gr.affinities(run, gr.encoder_layer(k))) for k in (1, 2)]
    assert gr.depth_scores(run, cfg.tasks, 2) == pytest.approx({0: 0.0, 1: per_layer[0], 2: sum(per_layer)})
