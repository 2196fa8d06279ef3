"""Per-task options and per-task mappings: the head of any similarity pair task, keys checked
against `tasks`, loss weights summing to 1, any cascade chain, and task specs checked when
they are registered."""
from __future__ import annotations

import pytest
import torch

from mtbert.config import ConfigError, build_config, load_config
from mtbert.tasks import TASKS, TaskSpec, register_task

SICK = TaskSpec(name="sick", kind="regression", label_range=(1.0, 5.0), metric_name="sick_corr", pair=True)


@pytest.fixture
def sick():
    register_task(SICK)
    yield SICK
    TASKS.pop("sick", None)


def test_a_second_similarity_task_gets_a_cosine_head(sick, tmp_path):
    from mtbert.model.multitask import MultitaskModel
    from mtbert.train.loop import train

    cfg = build_config({"tasks": ["sst", "sts", "sick"], "task_options": {"sick": {"head": "cosine"}},
                        "data": {"cache_dir": str(tmp_path)}, "train": {"epochs": 1},
                        "sampling": {"strategy": "tuple", "steps_per_epoch": 5}})
    assert cfg.task_head("sick") == "cosine" and cfg.task_head("sts") == "regression"
    model = MultitaskModel(cfg, vocab_size=100)
    assert "sick" not in model.pair_proj and "sts" in model.pair_proj
    u, v = torch.randn(4, 64), torch.randn(4, 64)
    out = model.predict_from_pooled("sick", [u, v])
    assert out.shape == (4, 1) and bool(((out >= -1) & (out <= 1)).all())  # the cosine itself
    result = train(cfg, log=None)
    assert -1 <= result.metrics["sick_corr"] <= 1


def test_sts_head_keeps_meaning_the_sts_task(sick):
    from mtbert.model.multitask import MultitaskModel

    cfg = build_config({"tasks": ["sts", "sick"], "sts": {"head": "cosine"}})
    assert cfg.task_head("sts") == "cosine" and cfg.task_head("sick") == "regression"
    model = MultitaskModel(cfg, vocab_size=100)
    assert "sts" not in model.pair_proj and model.sts_cosine
    # task_options wins where both are set.
    assert build_config({"sts": {"head": "cosine"},
                         "task_options": {"sts": {"head": "regression"}}}).task_head("sts") == "regression"


@pytest.mark.parametrize("raw, line", [
    ({"heads": {"task_dropout": {"nosuch": 0.3}}},
     "config: heads.task_dropout.nosuch: 'nosuch' is not one of tasks ['sst', 'para', 'sts']"),
    ({"task_options": {"stss": {"max_length": 32}}},
     "config: task_options.stss: 'stss' is not one of tasks ['sst', 'para', 'sts'] (did you mean 'sts'?)"),
    ({"loss": {"weights": {"sst": 1, "para": 1, "sts": 1}}},
     "config: loss.weights: must sum to 1, got 3 (not normalised: a larger sum would act as a larger "
     "learning rate)"),
    ({"loss": {"weights": {"sst": 0.5, "sts": 0.3}}},
     "config: loss.weights: must sum to 1, got 0.8; para weigh 0 (not normalised: a larger sum would act "
     "as a larger learning rate)"),
    ({"task_options": {"para": {"head": "cosine"}}},
     "config: task_options.para.head: cosine scores a sentence pair on a scale; 'para' is a binary pair task"),
    ({"task_options": {"sts": {"head": "cosine"}}, "pairs": {"encoding": "cross"}},
     "config: task_options.sts.head: cosine needs pairs.encoding: bi (two sentence vectors)"),
    ({"task_options": {"sst": {"max_length": 0}}}, "config: task_options.sst.max_length: must be > 0, got 0"),
    ({"sharing": {"cascade": "sst>nosuch"}, "pairs": {"encoding": "cross"}},
     "config: sharing.cascade: 'sst>nosuch' needs tasks ['nosuch'] which are not in tasks ['sst', 'para', 'sts']"),
    ({"sharing": {"cascade": "sst"}, "pairs": {"encoding": "cross"}},
     "config: sharing.cascade: expected none or tasks joined by '>' upstream first (e.g. sst>para>sts), got 'sst'"),
    ({"sharing": {"cascade": "sst>para>sst"}, "pairs": {"encoding": "cross"}},
     "config: sharing.cascade: 'sst>para>sst' names a task twice"),
])
def test_per_task_mistakes_are_one_line(raw, line):
    with pytest.raises(ConfigError) as err:
        build_config(raw)
    assert str(err.value) == line


def test_partial_weights_summing_to_one_leave_the_rest_at_zero():
    cfg = build_config({"loss": {"weights": {"sst": 0.7, "sts": 0.3}}})
    assert [cfg.loss_weight(t) for t in cfg.tasks] == [0.7, 0.0, 0.3]


def test_a_cascade_may_be_any_chain_of_configured_tasks(sick):
    from mtbert.model.multitask import MultitaskModel

    cfg = build_config({"tasks": ["sst", "para", "sts", "sick"], "sharing": {"cascade": "para > sick>sst"},
                        "pairs": {"encoding": "cross"}})
    assert cfg.sharing.cascade == "para>sick>sst"
    model = MultitaskModel(cfg, vocab_size=100)
    # sst reads pooled + para's 1 logit + sick's 1 output; sts is outside the chain.
    assert model.heads.layers[0]["sst"].in_features == 64 + 2
    assert model.heads.layers[0]["sts"].in_features == 64


def test_a_sweep_file_given_to_train_says_so(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text("name: x\nbase: {optim: {lr: 0.001}}\nspace: {optim.lr: [0.001, 0.002]}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (f"{path}: a sweep file (it has space:, base:), not a training config; "
                              f"run it with `mtbert sweep run {path}`")


@pytest.mark.parametrize("spec, line", [
    (TaskSpec(name="bad", kind="binry", metric_name="bad_acc", pair=False),
     "register_task('bad'): unknown kind 'binry' (did you mean 'binary'?); expected one of multiclass, binary, regression"),
    (TaskSpec(name="bad", kind="multiclass", num_classes=1, metric_name="bad_acc", pair=False),
     "register_task('bad'): multiclass needs num_classes >= 2, got 1"),
    (TaskSpec(name="bad", kind="regression", label_range=(5.0, 0.0), metric_name="bad_corr", pair=True),
     "register_task('bad'): label_range must be (low, high) with low < high, got (5.0, 0.0)"),
    (TaskSpec(name="bad", kind="binary", metric_name="sst_acc", pair=False),
     "register_task('bad'): metric_name 'sst_acc' is already task 'sst's"),
    (TaskSpec(name="bad-name", kind="binary", metric_name="b_acc", pair=False),
     "register_task('bad-name'): name must be an identifier (it is a config key and an MLflow name)"),
])
def test_task_specs_are_checked_at_registration(spec, line):
    with pytest.raises(ValueError) as err:
        register_task(spec)
    assert str(err.value) == line
    assert spec.name not in TASKS
