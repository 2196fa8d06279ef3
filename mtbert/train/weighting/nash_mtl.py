"""Nash-MTL (Navon, Shamsian, Achituve, Maron, Kawaguchi, Chechik and Fetaya 2022, "Multi-task
learning as a bargaining game", Algorithm 1), from TorchJD: the weights alpha with
G alpha = 1 / alpha (the Nash bargaining solution), solved by a short sequence of convex
problems (cvxpy with ECOS, an optional extra of torchjd), warm-started from the last step's.

Its state is the last step's alpha, carried by the checkpoint: a resumed run solves from the
same start. TorchJD's update_weights_every is left at 1 (a solve every step), so the state is
alpha alone. TorchJD's Nash-MTL reads the per-task gradients themselves, not their Gram matrix:
it forms the Gram matrix again (counted) and, with max_norm, the step's norm.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from mtbert.components import require
from mtbert.train.weighting.base import StepCost, TaskGradients
from mtbert.train.weighting.torchjd import TorchJDWeighting


class NashMTL(TorchJDWeighting):
    name = "nash_mtl"
    requires = ("torchjd", "cvxpy", "ecos")
    extra = "nash-mtl"

    @dataclass
    class Settings(TorchJDWeighting.Settings):
        max_norm: float = 1.0  # the step sum_i alpha_i g_i is scaled down to this norm; 0 = never
        optim_niter: int = 20  # convex problems solved per step at most

        def check(self, key):
            require(self.max_norm >= 0, f"{key}.max_norm: must be >= 0, got {self.max_norm}")
            require(self.optim_niter >= 1, f"{key}.optim_niter: must be >= 1, got {self.optim_niter}")

    def make_weighting(self):
        from torchjd.aggregation import NashMTL as Aggregator

        aggregator = Aggregator(n_tasks=len(self.tasks), max_norm=self.settings.max_norm,
                                update_weights_every=1, optim_niter=self.settings.optim_niter)
        return aggregator.weighting  # the per-task gradients -> alpha

    def coefficients(self, grads: TaskGradients, tasks: list[str]) -> torch.Tensor:
        with warnings.catch_warnings():
            # cvxpy says at every step that this problem recompiles (it is not DPP): known, once is enough.
            warnings.filterwarnings("ignore", message="You are solving a parameterized problem that is not DPP")
            alpha = self.solver(grads.flat)
        return alpha.to(device=grads.flat.device, dtype=grads.flat.dtype)

    def cost(self, grads: TaskGradients) -> StepCost:
        cost = super().cost(grads)
        # TorchJD forms G G^T itself, and the norm of the step for max_norm.
        size, tasks = grads.flat.shape[1], grads.num_tasks
        return StepCost(cost.extra_backward, cost.solve_flops + 2 * tasks * tasks * size + 2 * tasks * size)

    def state_dict(self):
        return {"alpha": torch.as_tensor(self.solver.prvs_alpha).clone(), "steps": int(self.solver.step)}

    def load_state_dict(self, state):
        if "alpha" in state:
            # A fresh solver (its problem is built at its first call) warm-started from the saved alpha.
            self.solver = self.make_weighting()
            self.solver.prvs_alpha = state["alpha"].cpu().numpy().copy()  # its dtype as saved (float64 after a solve)
