"""PCGrad (Yu et al. 2020) on the shared parameters, over the fixed-weight losses; the
surgery itself is mtbert/train/pcgrad.py. The reported weights are the fixed ones: PCGrad
changes directions, not weights."""
from __future__ import annotations

import torch

from mtbert.train.pcgrad import pcgrad_backward
from mtbert.train.weighting.static import Static


class PCGrad(Static):
    name = "pcgrad"
    needs_every_task = True

    def __init__(self, cfg, device):
        super().__init__(cfg, device)
        # Seeded per run: PCGrad visits the other tasks in a random order.
        self.generator = torch.Generator(device=device).manual_seed(cfg.train.seed)

    def backward(self, losses, shared):
        pcgrad_backward([self.weights[t] * loss for t, loss in losses.items()], shared, generator=self.generator)
        return {t: self._as_tensors[t] for t in losses}

    def state_dict(self):
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state):
        if "generator" in state:
            self.generator.set_state(state["generator"].cpu())
