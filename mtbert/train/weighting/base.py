"""The interface every loss-weighting method implements (one small class per file), and the
one place that gathers per-task gradients for the methods that work on them
(task_gradients, GradientWeighting): PCGrad, CAGrad, GradNorm and the TorchJD aggregators."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mtbert.components import SAMPLERS, WEIGHTINGS, Settings
from mtbert.errors import ConfigError

if TYPE_CHECKING:  # the config reaches the methods through mtbert.components, never the reverse
    from mtbert.config import Config


class WeightingError(ValueError):
    """A weighting method cannot run on this model; the message is one readable line."""


class Weighting:
    """Turns one step's per-task losses into the update, accumulated into the parameters'
    .grad (so several micro-batches can accumulate before the optimizer steps).

    Created once per run. `losses` maps each task trained this step to its scalar loss (raw,
    unweighted; SMART's term included). `shared` are the trainable parameters several tasks
    use, for the methods that work on per-task gradients.
    """

    name = ""
    # True: the method needs a loss for several tasks in one step (sampling.strategy: tuple).
    needs_every_task = False
    # True: the method reads loss.weights; the others set their own weights.
    uses_fixed_weights = False
    # The method's own settings (`loss.weighting: {name: ..., <field>: ...}`): a subclass of
    # Settings beside the method, with its ranges in Settings.check. None by default.
    Settings = Settings

    def __init__(self, cfg: Config, device: torch.device):
        self.cfg = cfg
        self.settings = cfg.loss.weighting
        self.tasks = list(cfg.tasks)
        self.device = device

    @classmethod
    def check_config(cls, settings: Settings, key: str, cfg: Config) -> None:
        """What the method needs of the rest of the config (after its settings' own check)."""
        strategy = cfg.sampling.strategy.name
        if cls.needs_every_task and not SAMPLERS.lookup(strategy, "sampling.strategy").every_task:
            what = "" if key == "loss.pcgrad" else f" {cls.name}"
            raise ConfigError(f"{key}:{what} needs a loss for several tasks in one step; "
                              f"set sampling.strategy: tuple (got '{strategy}')")
        if cfg.loss.weights is not None and not cls.uses_fixed_weights:
            readers = " or ".join(sorted(n for n, c in WEIGHTINGS.items() if c.uses_fixed_weights))
            raise ConfigError(f"loss.weights: fixed weights are read by loss.weighting {readers}; "
                              f"{cls.name} sets its own, so leave loss.weights null")

    def backward(self, losses: dict[str, torch.Tensor], shared: list[nn.Parameter]) -> dict[str, torch.Tensor]:
        """Backward pass of this step; returns the effective weight of each task in `losses`
        (0-dim tensors, left on the device so that no step waits for a host sync)."""
        raise NotImplementedError

    def extra_flops(self, model: Any, packed: Any, device: torch.device, start: int) -> int:
        """FLOPs the last backward spent beyond a plain backward of the weighted sum (extra
        passes, the combination of per-task gradients), which the model's step_flops does not
        count: the trial's train_flops adds them. `model`, `packed`, `start`: as step_flops."""
        return 0

    def parameters(self) -> list[nn.Parameter]:
        """Learned parameters the run's optimizer should train with the model."""
        return []

    def end_epoch(self, mean_losses: dict[str, float]) -> None:
        """Called after each epoch with each task's mean training loss over it."""

    def state_dict(self) -> dict:
        """What a checkpoint must carry to resume the method where it was."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class StepCost:
    """What a step of a gradient method costs beyond a plain backward of the weighted sum: the
    trial's compute (train_flops) counts it (Weighting.extra_flops)."""
    extra_backward: int = 0  # backward passes through the trainable shared layers beyond a plain step's one
    solve_flops: int = 0  # the P-sized arithmetic on the per-task gradients (Gram matrix, combination)


def graph_leaves(losses: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Every leaf tensor that .backward() on these losses would write a .grad to."""
    leaves: dict[int, torch.Tensor] = {}
    seen: set[torch.autograd.graph.Node] = set()
    stack = [loss.grad_fn for loss in losses if loss.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        leaf = getattr(node, "variable", None)  # only AccumulateGrad nodes carry one
        if leaf is not None:
            leaves.setdefault(id(leaf), leaf)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return list(leaves.values())


def accumulate(param: torch.Tensor, grad: torch.Tensor) -> None:
    """Add `grad` to param.grad as .backward() would (micro-batches accumulate)."""
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)


@dataclass
class TaskGradients:
    """One gradient per task on the shared parameters, flattened into the rows of `flat`
    (T x P), and the gradient of every other parameter the losses reach, already combined
    with the per-task weights that task_gradients was given."""
    flat: torch.Tensor | None  # None: no trainable shared parameter is reached
    shared: list[torch.Tensor]
    others: list[torch.Tensor]
    other_grads: list[torch.Tensor | None]

    @property
    def num_tasks(self) -> int:
        return 0 if self.flat is None else self.flat.shape[0]

    def gram(self) -> torch.Tensor:
        """The T x T Gram matrix g_i . g_j: what every method here decides from."""
        return self.flat @ self.flat.T

    def apply(self, coefficients: torch.Tensor | None) -> None:
        """Accumulate sum_i coefficients_i g_i into the shared parameters' .grad and the other
        parameters' combined gradients into theirs (the graph is already freed)."""
        if self.flat is not None and coefficients is not None:
            direction = coefficients.to(self.flat.dtype) @ self.flat
            for p, chunk in zip(self.shared, direction.split([p.numel() for p in self.shared])):
                accumulate(p, chunk.view_as(p).to(p.dtype))
        for p, grad in zip(self.others, self.other_grads):
            if grad is not None:
                accumulate(p, grad)

    @staticmethod
    def combine_flops(num_tasks: int, size: int) -> int:
        """The Gram matrix (2 T^2 P) and the combination sum_i a_i g_i (2 T P)."""
        return 2 * num_tasks * num_tasks * size + 2 * num_tasks * size


def task_gradients(losses: Sequence[torch.Tensor], shared: Sequence[torch.nn.Parameter],
                   other_weights: Sequence[float] | None = None) -> TaskGradients:
    """The gradient of each loss on the trainable `shared` parameters the losses reach (one
    backward pass per loss, T in all where a plain step runs one), and for every other
    parameter sum_i other_weights_i grad L_i (1 each by default), from the same passes. The
    graph is freed afterwards, as .backward() would do; nothing is written to .grad."""
    if not losses:
        raise ValueError("task_gradients: got no losses")
    for t, loss in enumerate(losses):
        if loss.dim() != 0 or not loss.requires_grad:
            raise ValueError(f"task_gradients: loss {t} must be a scalar that requires grad")
    leaves = graph_leaves(losses)
    # Like .backward(): frozen or unreached shared parameters get no .grad at all.
    reached = {id(p) for p in leaves}
    shared = list({id(p): p for p in shared if id(p) in reached}.values())
    shared_ids = {id(p) for p in shared}
    others = [p for p in leaves if id(p) not in shared_ids]
    sizes = [p.numel() for p in shared]
    flat = torch.zeros((len(losses), sum(sizes)), dtype=torch.promote_types(shared[0].dtype, torch.float32),
                       device=shared[0].device) if shared else None
    other_grads: list[torch.Tensor | None] = [None] * len(others)
    for t, loss in enumerate(losses):
        grads = torch.autograd.grad(loss, shared + others, retain_graph=t < len(losses) - 1, allow_unused=True)
        if flat is not None:
            for p_grad, chunk in zip(grads[:len(shared)], flat[t].split(sizes)):
                if p_grad is not None:  # unused by this task: a zero gradient for it
                    chunk.copy_(p_grad.reshape(-1))
        weight = 1.0 if other_weights is None else other_weights[t]
        for k, p_grad in enumerate(grads[len(shared):]):
            if p_grad is not None:
                p_grad = p_grad if weight == 1.0 else p_grad * weight
                other_grads[k] = p_grad if other_grads[k] is None else other_grads[k] + p_grad
    return TaskGradients(flat, shared, others, other_grads)


def layer_gradients(losses: Sequence[torch.Tensor], param: torch.nn.Parameter) -> torch.Tensor:
    """The gradient of each loss on one parameter, flattened into the rows of a T x numel
    matrix: the cheap variant of task_gradients for a method that reads one layer (GradNorm),
    whose passes stop at that layer. The graph is kept for the step's own backward."""
    return torch.stack([torch.autograd.grad(loss, param, retain_graph=True)[0].reshape(-1) for loss in losses])


class GradientWeighting(Weighting):
    """A method that decides the shared parameters' step from the per-task gradients on them:
    a subclass gives `coefficients` (a_i, from the gradients, in practice from their Gram
    matrix) and the shared parameters step along sum_i a_i g_i. Every other parameter (a
    task's own layers and head) gets sum_i v_i grad L_i, v = `other_weights` (the mean by
    default, static equal weighting's scale).

    The per-task gradients cost T - 1 backward passes through the shared layers beyond a
    plain step's one; `last_cost` says so for the step just run, and extra_flops turns it into
    FLOPs for the trial's count."""

    needs_every_task = True

    def __init__(self, cfg: Config, device: torch.device):
        super().__init__(cfg, device)
        self.last_cost = StepCost()

    def other_weights(self, tasks: list[str]) -> list[float]:
        """v_i: loss.weights for a method that reads them, else the mean."""
        if self.uses_fixed_weights:
            return [self.cfg.loss_weight(t) for t in tasks]
        return [1.0 / len(tasks)] * len(tasks)

    def coefficients(self, grads: TaskGradients, tasks: list[str]) -> torch.Tensor:
        """a_i of each task's gradient (a T-vector on the gradients' device)."""
        raise NotImplementedError

    def backward(self, losses, shared):
        tasks = list(losses)
        grads = task_gradients(list(losses.values()), shared, self.other_weights(tasks))
        if grads.flat is None:
            raise WeightingError(f"loss.weighting: {self.name} needs trainable shared parameters (the encoder "
                                 "is frozen or not shared); choose another method")
        coefficients = self.coefficients(grads, tasks)
        grads.apply(coefficients)
        self.last_cost = self.cost(grads)
        return dict(zip(tasks, coefficients))  # weight_<task>: a_i

    def cost(self, grads: TaskGradients) -> StepCost:
        """T - 1 extra passes, and the Gram matrix and the combination; a method whose solve
        does more P-sized work adds it."""
        return StepCost(grads.num_tasks - 1, TaskGradients.combine_flops(grads.num_tasks, grads.flat.shape[1]))

    def extra_flops(self, model: Any, packed: Any, device: torch.device, start: int) -> int:
        # Read once: a step that ran no backward (nothing to learn) adds nothing.
        cost, self.last_cost = self.last_cost, StepCost()
        return cost.extra_backward * model.shared_backward_flops(packed, device, start) + cost.solve_flops
