"""Each loss-weighting method against its paper's formula on a toy two-task problem whose
gradients are known in closed form:

    L_i = <A_i, W> + <c_i, h_i> + b_i

W (1 x 2) is shared, h_i is task i's head: dL_i/dW = A_i and dL_i/dh_i = c_i, whatever W is.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from mtbert.config import ConfigError, build_config
from mtbert.train.weighting.pcgrad import pcgrad_backward
from mtbert.train.weighting import WEIGHTINGS, make_weighting
from mtbert.train.weighting.cagrad import cagrad_coefficients
from mtbert.train.weighting.dwa import DWA

TASKS = ["sst", "sts"]
TUPLE = {"tasks": TASKS, "sampling.strategy": "tuple"}


class Toy:
    def __init__(self, a1, a2, b=(2.0, 3.0), c=((1.0,), (-2.0,))):
        self.A = [torch.tensor([a1], dtype=torch.float64), torch.tensor([a2], dtype=torch.float64)]
        self.c = [torch.tensor(ci, dtype=torch.float64) for ci in c]
        self.b = list(b)
        self.W = nn.Parameter(torch.zeros(1, 2, dtype=torch.float64))
        self.heads = [nn.Parameter(torch.zeros(1, dtype=torch.float64)) for _ in TASKS]

    def losses(self, b=None) -> dict[str, torch.Tensor]:
        b = b or self.b
        return {t: (self.A[i] * self.W).sum() + (self.c[i] * self.heads[i]).sum() + b[i]
                for i, t in enumerate(TASKS)}

    def zero(self) -> None:
        for p in (self.W, *self.heads):
            p.grad = None


def _method(name: str, **overrides):
    cfg = build_config({}, {**TUPLE, "loss.weighting": name, **overrides})
    return make_weighting(cfg)


def _as_floats(weights: dict) -> list[float]:
    return [float(weights[t]) for t in TASKS]


def test_static_steps_along_the_weighted_sum():
    toy = Toy([1.0, 0.0], [0.0, 1.0])
    method = _method("static", **{"loss.weights": {"sst": 0.25, "sts": 0.75}})
    weights = method.backward(toy.losses(), [toy.W])
    assert _as_floats(weights) == [0.25, 0.75]
    torch.testing.assert_close(toy.W.grad, torch.tensor([[0.25, 0.75]], dtype=torch.float64))
    torch.testing.assert_close(toy.heads[1].grad, torch.tensor([0.75 * -2.0], dtype=torch.float64))


def test_uncertainty_weights_are_exp_minus_s_and_its_regulariser_is_added():
    toy = Toy([1.0, 0.0], [0.0, 2.0])
    method = _method("uncertainty")
    s = torch.tensor([0.5, -0.3])
    with torch.no_grad():
        method.log_vars.copy_(s)
    assert method.parameters() == [method.log_vars]
    weights = method.backward(toy.losses(), [toy.W])
    expected = torch.exp(-s)
    torch.testing.assert_close(torch.tensor(_as_floats(weights)), expected)
    torch.testing.assert_close(toy.W.grad, torch.tensor([[expected[0], 2 * expected[1]]], dtype=torch.float64))
    # d/ds_i [exp(-s_i) L_i + s_i] = 1 - exp(-s_i) L_i: the + s_i term is there.
    losses = torch.tensor(toy.b, dtype=torch.float32)
    torch.testing.assert_close(method.log_vars.grad, 1 - expected * losses)
    # At its optimum exp(-s_i) = 1 / L_i: the larger loss gets the smaller weight.
    opt = torch.optim.SGD(method.parameters(), lr=0.1)
    for _ in range(500):
        opt.zero_grad()
        toy.zero()
        method.backward(toy.losses(), [toy.W])
        opt.step()
    torch.testing.assert_close(torch.exp(-method.log_vars.detach()), 1 / losses, atol=1e-3, rtol=0)


def test_uncertainty_with_one_task_per_step_touches_only_that_tasks_variance():
    toy = Toy([1.0, 0.0], [0.0, 1.0])
    method = make_weighting(build_config({}, {"tasks": TASKS, "loss.weighting": "uncertainty"}))
    weights = method.backward({"sts": toy.losses()["sts"]}, [toy.W])
    assert list(weights) == ["sts"]
    assert method.log_vars.grad[0] == 0 and method.log_vars.grad[1] != 0


def _gradnorm_run(toy, method, steps, b_of_step=lambda step: None):
    norms = torch.tensor([a.norm() for a in toy.A], dtype=torch.float32)
    history = []
    for step in range(steps):
        toy.zero()
        used = torch.tensor(_as_floats(method.backward(toy.losses(b_of_step(step)), [toy.W])))
        history.append(used)
        assert float(method.weights.detach().sum()) == pytest.approx(len(TASKS), abs=1e-5)  # renormalised every step
    return norms, history


def test_gradnorm_moves_the_weights_toward_equal_gradient_norms_and_keeps_their_sum():
    toy = Toy([4.0, 0.0], [0.0, 1.0])  # task sst's gradient is 4x task sts's
    method = _method("gradnorm", **{"loss.gradnorm.lr": 0.01})
    norms, history = _gradnorm_run(toy, method, 300)
    # The first step runs at weight 1 each: the network gets A_1 + A_2.
    torch.testing.assert_close(history[0], torch.ones(2))
    gaps = [float((w * norms)[0] - (w * norms)[1]) for w in history]
    assert gaps[0] == pytest.approx(3.0)
    # The gap shrinks every step until the norms meet (Adam moves each weight ~lr a step),
    # then stays within a few steps' worth of it.
    assert all(b < a for a, b in zip(gaps[:55], gaps[1:55]))
    assert max(abs(g) for g in gaps[-50:]) < 0.05
    final = method.weights.detach()
    # Losses do not move, so r_i = 1: the weighted norms meet, w_i ∝ 1 / ||A_i||, sum 2.
    torch.testing.assert_close(final, torch.tensor([0.4, 1.6]), atol=0.03, rtol=0)
    # And the network always steps along sum_i w_i A_i with the step's weights.
    toy.zero()
    used = method.weights.detach().clone()
    method.backward(toy.losses(), [toy.W])
    torch.testing.assert_close(toy.W.grad, torch.tensor([[4 * used[0], used[1]]], dtype=torch.float64))


def test_gradnorm_gives_the_slower_task_the_larger_gradient_by_r_to_the_alpha():
    toy = Toy([1.0, 0.0], [0.0, 1.0])  # equal gradient norms
    alpha = 1.0
    method = _method("gradnorm", **{"loss.gradnorm.lr": 0.01, "loss.gradnorm.alpha": alpha})
    # sst's loss halves after the first step, sts's stays: r = (0.5, 1) / 0.75.
    _gradnorm_run(toy, method, 300, b_of_step=lambda step: None if step == 0 else [1.0, 3.0])
    w = method.weights.detach()
    assert float(w[0] / w[1]) == pytest.approx(0.5 ** alpha, abs=0.03)


def test_dwa_weights_are_k_times_softmax_of_loss_ratios_over_t():
    toy = Toy([1.0, 0.0], [0.0, 1.0])
    method = _method("dwa", **{"loss.dwa.temperature": 2.0})
    assert _as_floats(method.backward(toy.losses(), [toy.W])) == [1.0, 1.0]  # epoch 1: no ratio yet
    method.end_epoch({"sst": 1.0, "sts": 2.0})
    assert _as_floats(method.backward(toy.losses(), [toy.W])) == [1.0, 1.0]  # epoch 2: still none
    method.end_epoch({"sst": 0.5, "sts": 1.8})
    toy.zero()
    weights = _as_floats(method.backward(toy.losses(), [toy.W]))
    r = [0.5 / 1.0, 1.8 / 2.0]
    z = sum(math.exp(x / 2.0) for x in r)
    expected = [2 * math.exp(x / 2.0) / z for x in r]
    assert weights == pytest.approx(expected)
    assert sum(weights) == pytest.approx(2.0) and weights[1] > weights[0]  # sts fell slower
    torch.testing.assert_close(toy.W.grad, torch.tensor([expected], dtype=torch.float64))
    # The loss history is what a checkpoint carries.
    again = _method("dwa", **{"loss.dwa.temperature": 2.0})
    again.load_state_dict(method.state_dict())
    toy.zero()
    assert _as_floats(again.backward(toy.losses(), [toy.W])) == pytest.approx(expected)
    method.end_epoch({"sst": 0.5, "sts": 0.9})  # only the last two epochs count
    assert DWA.epoch_weights(method.history, 2.0) == pytest.approx(
        [2 * math.exp(1 / 2) / (math.exp(1 / 2) + math.exp(0.25)), 2 * math.exp(0.25) / (math.exp(1 / 2) + math.exp(0.25))])


def test_famo_weights_are_c_z_over_loss_and_its_logits_follow_the_loss_decrease():
    toy = Toy([1.0, 0.0], [0.0, 1.0], b=(2.0, 4.0))
    method = _method("famo", **{"loss.weighting.lr": 0.1, "loss.weighting.gamma": 0.0})
    # First step: w = 0, z = (1/2, 1/2); weight_i = c z_i / L_i with c = 1 / sum_j z_j / L_j.
    weights = _as_floats(method.backward(toy.losses(), [toy.W]))
    inv = [1 / 2.0, 1 / 4.0]
    expected = [x / sum(inv) for x in inv]
    assert weights == pytest.approx(expected) and sum(weights) == pytest.approx(1.0)
    torch.testing.assert_close(toy.W.grad, torch.tensor([expected], dtype=torch.float64))
    assert method.parameters() == []  # the logits have their own optimizer, not the model's
    # sst's loss halves, sts's stays: delta = J_softmax^T [log 2, 0] = [log2 / 4, -log2 / 4],
    # and Adam's first step moves each logit by lr against its sign: sts gains weight.
    toy.zero()
    weights = _as_floats(method.backward(toy.losses([1.0, 4.0]), [toy.W]))
    torch.testing.assert_close(method.logits.detach(), torch.tensor([-0.1, 0.1]), rtol=0, atol=1e-6)
    z = torch.softmax(torch.tensor([-0.1, 0.1], dtype=torch.float64), 0)
    scaled = z / torch.tensor([1.0, 4.0], dtype=torch.float64)
    assert weights == pytest.approx((scaled / scaled.sum()).tolist(), rel=1e-6)
    # Its state carries the logits, their Adam moments and the last step's losses.
    again = _method("famo", **{"loss.weighting.lr": 0.1, "loss.weighting.gamma": 0.0})
    again.load_state_dict(method.state_dict())
    for m in (method, again):
        toy.zero()
        m.backward(toy.losses([0.5, 3.0]), [toy.W])
    torch.testing.assert_close(again.logits.detach(), method.logits.detach(), rtol=0, atol=0)


def test_famo_balances_the_rate_at_which_losses_fall():
    """With no decay, the logits settle where every task's log loss falls at the same rate:
    a task whose loss is harder to move ends with the larger weight."""
    steps = torch.tensor([1.0, 4.0], dtype=torch.float64)  # how fast each loss falls per unit weight
    method = _method("famo", **{"loss.weighting.lr": 0.05, "loss.weighting.gamma": 0.0})
    W = nn.Parameter(torch.zeros(2, dtype=torch.float64))
    for _ in range(2000):
        W.grad = None
        losses = torch.exp(-steps * W)  # dlog L_i / dW_i = -s_i
        method.backward(dict(zip(TASKS, losses)), [W])
        with torch.no_grad():
            W -= 0.05 * W.grad
    z = torch.softmax(method.logits.detach().double(), 0)
    assert float(z[0]) > float(z[1])  # sst's loss falls slower per unit weight
    # The step on W_i is lr c z_i s_i (the weight c z_i / L_i times dL_i/dW_i = -s_i L_i), so
    # log L_i falls by lr c z_i s_i^2: equal falls need z_i proportional to 1 / s_i^2.
    falls = steps ** 2 * z
    assert float(falls[0] / falls[1]) == pytest.approx(1.0, abs=0.1)
    assert float(z[0]) == pytest.approx(16 / 17, abs=0.01)


CONFLICTING = [([1.0, 0.0], [-0.9, 0.3]), ([3.0, 1.0], [-1.0, 0.2]), ([1.0, 2.0], [2.0, -3.0]),
               ([0.5, 0.0], [0.0, 4.0])]


@pytest.mark.parametrize("a1,a2", CONFLICTING)
def test_cagrad_with_c_zero_is_the_mean_gradient(a1, a2):
    toy = Toy(a1, a2)
    method = _method("cagrad", **{"loss.cagrad.c": 0.0})
    weights = method.backward(toy.losses(), [toy.W])
    assert _as_floats(weights) == pytest.approx([0.5, 0.5])
    mean = (toy.A[0] + toy.A[1]) / 2
    torch.testing.assert_close(toy.W.grad, mean, rtol=1e-6, atol=1e-6)
    # Heads get the gradient of the mean loss: c = 0 is static equal weighting's step.
    torch.testing.assert_close(toy.heads[1].grad, torch.tensor([-1.0], dtype=torch.float64))


@pytest.mark.parametrize("c", [0.2, 0.5, 1.0])
@pytest.mark.parametrize("a1,a2", CONFLICTING)
def test_cagrad_never_conflicts_more_than_the_mean(a1, a2, c):
    toy = Toy(a1, a2)
    method = _method("cagrad", **{"loss.cagrad.c": c})
    method.backward(toy.losses(), [toy.W])
    d = toy.W.grad.reshape(-1)
    grads = torch.stack([a.reshape(-1) for a in toy.A])
    g0 = grads.mean(0)
    worst_mean = float((grads @ g0).min())
    # Before the authors' 1 / (1 + c^2) rescaling, d maximises the worst task's improvement
    # over the ball ||d - g0|| <= c ||g0||, which holds g0 itself ...
    unscaled = d * (1 + c ** 2)
    assert float((unscaled - g0).norm()) <= c * float(g0.norm()) + 1e-5
    worst = float((grads @ unscaled).min())
    assert worst >= worst_mean - 1e-6
    # ... so it matches the best direction a dense search of the ball finds.
    angles = torch.linspace(0, 2 * math.pi, 3601, dtype=torch.float64)
    radii = torch.linspace(0, 1, 201, dtype=torch.float64)
    ring = torch.stack([torch.cos(angles), torch.sin(angles)], 1)
    cands = g0 + c * g0.norm() * (radii[:, None, None] * ring[None]).reshape(-1, 2)
    best = float((cands @ grads.T).min(1).values.max())
    assert worst == pytest.approx(best, abs=2e-3 * max(1.0, abs(best)))
    # The rescaled step conflicts with no task more than the mean does.
    assert min(0.0, float((grads @ d).min())) >= min(0.0, worst_mean) - 1e-6


def test_cagrad_coefficients_for_three_tasks_are_a_valid_combination():
    rng = np.random.default_rng(0)
    g = rng.normal(size=(3, 5))
    a = cagrad_coefficients(g @ g.T, 0.5)
    g0 = g.mean(0)
    d = a @ g
    assert np.linalg.norm(d - g0) <= 0.5 * np.linalg.norm(g0) + 1e-6
    assert (g @ d).min() >= (g @ g0).min() - 1e-9


def test_pcgrad_method_is_todays_surgery_on_the_weighted_losses():
    toy = Toy([1.0, 0.0], [-1.0, 1.0])
    method = _method("pcgrad", **{"loss.weights": {"sst": 0.5, "sts": 0.5}})
    assert _as_floats(method.backward(toy.losses(), [toy.W])) == [0.5, 0.5]
    via_method = toy.W.grad.clone()
    toy.zero()
    pcgrad_backward([0.5 * loss for loss in toy.losses().values()], [toy.W])
    torch.testing.assert_close(via_method, toy.W.grad)
    # g1 = [.5, 0], g2 = [-.5, .5]: both projected, summed (test_pcgrad.py's first case, halved)
    torch.testing.assert_close(via_method, torch.tensor([[0.25, 0.75]], dtype=torch.float64))


@pytest.mark.parametrize("name", ["pcgrad", "gradnorm", "famo", "cagrad", "upgrad", "nash_mtl", "mgda"])
def test_per_task_gradient_methods_need_tuple_sampling(name):
    with pytest.raises(ConfigError, match=rf"loss.weighting: {name} needs .* set sampling.strategy: tuple"):
        build_config({}, {"loss.weighting": name, "sampling.strategy": "proportional"})


def test_loss_pcgrad_is_an_alias_of_weighting_pcgrad():
    cfg = build_config({}, {"loss.pcgrad": True, "sampling.strategy": "tuple"})
    assert cfg.loss.weighting.name == "pcgrad"
    assert type(make_weighting(cfg)) is WEIGHTINGS["pcgrad"]
    with pytest.raises(ConfigError, match="loss.pcgrad: true is the old spelling of loss.weighting: pcgrad"):
        build_config({}, {"loss.pcgrad": True, "loss.weighting": "dwa", "sampling.strategy": "tuple"})


@pytest.mark.parametrize("overrides,message", [
    ({"loss.weighting": "gradnrom"}, r"loss.weighting: unknown method 'gradnrom' \(did you mean 'gradnorm'\?\)"),
    ({"loss.weighting": "dwa", "loss.weights": {"sst": 1.0}}, "loss.weights: fixed weights are read by"),
    ({"loss.dwa.temperature": 0}, "loss.dwa.temperature: must be > 0"),
    ({"loss.cagrad.c": -1}, "loss.cagrad.c: must be >= 0"),
    ({"loss.gradnorm.alpha": -1}, "loss.gradnorm.alpha: must be >= 0"),
    ({"loss.weighting": "famo", "loss.weighting.lr": 0}, "loss.weighting.lr: must be > 0"),
    ({"loss.weighting": "famo", "loss.weighting.gamma": -0.1}, "loss.weighting.gamma: must be >= 0"),
    ({"sampling.temperature": 0}, "sampling.temperature: must be > 0"),
])
def test_bad_weighting_settings_fail_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_config({}, overrides)


# The TorchJD methods: the step on the shared parameters is TorchJD's aggregation of the
# Jacobian (its rows the per-task gradients), though mtbert hands TorchJD their Gram matrix.
JD_AGGREGATORS = {"upgrad": "UPGrad", "dualproj": "DualProj", "aligned_mtl": "AlignedMTL", "imtl_g": "IMTLG",
                  "mgda": "MGDA"}


@pytest.mark.parametrize("name", sorted(JD_AGGREGATORS) + ["nash_mtl"])
@pytest.mark.parametrize("a1,a2", CONFLICTING[:2])
def test_a_torchjd_method_steps_along_torchjds_aggregation(name, a1, a2):
    import torchjd.aggregation as jd

    toy = Toy(a1, a2)
    method = _method(name)
    weights = method.backward(toy.losses(), [toy.W])
    jacobian = torch.stack([a.reshape(-1) for a in toy.A])
    aggregator = jd.NashMTL(n_tasks=2) if name == "nash_mtl" else getattr(jd, JD_AGGREGATORS[name])()
    torch.testing.assert_close(toy.W.grad.reshape(-1), aggregator(jacobian), rtol=1e-5, atol=1e-6)
    assert all(math.isfinite(w) for w in _as_floats(weights))
    # A task's own parameters get the gradient of the mean loss, as under static weighting.
    torch.testing.assert_close(toy.heads[1].grad, torch.tensor([-1.0], dtype=torch.float64))
    cost = method.last_cost
    assert cost.extra_backward == 1 and cost.solve_flops >= 2 * 2 * 2 * 2 + 2 * 2 * 2


def test_upgrad_reads_loss_weights_as_its_preference():
    toy = Toy([1.0, 0.0], [0.0, 1.0])  # orthogonal: no conflict, UPGrad is the weighted mean
    method = _method("upgrad", **{"loss.weights": {"sst": 0.25, "sts": 0.75}})
    method.backward(toy.losses(), [toy.W])
    torch.testing.assert_close(toy.W.grad, torch.tensor([[0.25, 0.75]], dtype=torch.float64), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(toy.heads[1].grad, torch.tensor([0.75 * -2.0], dtype=torch.float64))


def test_nash_mtl_state_resumes_its_solve():
    toy = Toy([1.0, 0.2], [-0.5, 1.0])
    method, again = _method("nash_mtl"), _method("nash_mtl")
    for _ in range(3):
        toy.zero()
        method.backward(toy.losses(), [toy.W])
    again.load_state_dict(method.state_dict())
    grads = []
    for m in (method, again):
        toy.zero()
        m.backward(toy.losses([1.0, 5.0]), [toy.W])
        grads.append(toy.W.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)


@pytest.mark.parametrize("overrides,message", [
    ({"loss.weighting": {"name": "mgda", "max_iter": 5}},
     r"loss.weighting.max_iter: not a setting of method mgda \(did you mean 'loss.weighting.max_iters'\?\)"),
    ({"loss.weighting": "mgda", "loss.weighting.max_iters": "many"}, r"loss.weighting.max_iters: expected int"),
    ({"loss.weighting": "mgda", "loss.weighting.epsilon": 0}, "loss.weighting.epsilon: must be > 0"),
    ({"loss.weighting": "upgrad", "loss.weighting.reg_eps": -1}, "loss.weighting.reg_eps: must be >= 0"),
    ({"loss.weighting": "aligned_mtl", "loss.weighting.scale_mode": "max"},
     "loss.weighting.scale_mode: must be one of min, median, rmse, got 'max'"),
    ({"loss.weighting": "nash_mtl", "loss.weighting.optim_niter": 0}, "loss.weighting.optim_niter: must be >= 1"),
    ({"loss.weighting": "imtl_g", "loss.weights": {"sst": 0.5, "sts": 0.5}}, "loss.weights: fixed weights are read by"),
    ({"loss.weighting": "upgrad", "sampling.strategy": "proportional"}, "loss.weighting: upgrad needs a loss for"),
])
def test_bad_torchjd_settings_fail_at_load_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        build_config({}, {**TUPLE, **overrides})
    assert "\n" not in str(err.value)


def test_a_missing_solver_package_is_one_line_at_load(monkeypatch):
    monkeypatch.setattr(WEIGHTINGS["nash_mtl"], "requires", ("torchjd", "no_such_solver_pkg"))
    with pytest.raises(ConfigError, match=r"loss.weighting: nash_mtl needs the package\(s\) no_such_solver_pkg, "
                                          r"which are not installed; pip install 'torchjd\[nash-mtl\]'") as err:
        build_config({}, {**TUPLE, "loss.weighting": "nash_mtl"})
    assert "\n" not in str(err.value)


def test_the_labels_know_which_methods_read_fixed_weights():
    """orchestration's weights column names them without importing the methods (no torch)."""
    from orchestration.sweep.labels import FIXED_WEIGHT_READERS, fmt_weighting

    assert sorted(FIXED_WEIGHT_READERS) == sorted(n for n, c in WEIGHTINGS.items() if c.uses_fixed_weights
                                                  and n != "static")
    assert fmt_weighting("upgrad", {"sst": 0.25, "sts": 0.75}, TASKS).startswith("upgrad [")
    assert fmt_weighting("mgda", None, TASKS) == "mgda"
