"""Task heads with head-level hard sharing (mops-tm-relative-score.txt) and cascades
(progressive-layer-sharing.txt).

`sharing.head_regime` is one letter per hidden head layer: S = one Linear object used by
every task in `sharing.head_share_tasks` (all tasks by default), I = one Linear per task.
A task outside the share set gets its own layer where the others share. Each hidden layer
is Linear -> ReLU -> Dropout (the paper's a_i = ReLU(W_i a_{i-1} + b_i)); the output layer
is always per task.
"""
from __future__ import annotations

import torch
from torch import nn

from mtbert.tasks import TaskSpec


class Heads(nn.Module):
    def __init__(self, tasks: list[TaskSpec], in_dims: dict[str, int], regime: list[str],
                 width: int, dropout: dict[str, float], share_tasks: list[str] | None = None,
                 out_dims: dict[str, int] | None = None):
        super().__init__()
        names = [t.name for t in tasks]
        share = set(share_tasks if share_tasks is not None else names)
        self.depth = len(regime)
        # layers[j][task] -> Linear; shared layers are the same object under several keys,
        # so parameters() and the optimizer see them once.
        self.layers = nn.ModuleList()
        for j, letter in enumerate(regime):
            per_task = nn.ModuleDict()
            shared: nn.Linear | None = None
            for name in names:
                d_in = in_dims[name] if j == 0 else width
                if letter == "S" and name in share:
                    if shared is None:
                        shared = nn.Linear(d_in, width)
                    elif shared.in_features != d_in:
                        raise ValueError(f"sharing.head_regime: layer {j + 1} is shared but tasks "
                                         f"feed it different widths ({shared.in_features} vs {d_in}); "
                                         "a cascade needs an individual (I) first head layer")
                    per_task[name] = shared
                else:
                    per_task[name] = nn.Linear(d_in, width)
            self.layers.append(per_task)
        out_dims = out_dims or {t.name: t.out_dim for t in tasks}
        self.out = nn.ModuleDict({t.name: nn.Linear(width if regime else in_dims[t.name],
                                                    out_dims[t.name]) for t in tasks})
        self.dropout = nn.ModuleDict({n: nn.Dropout(dropout[n]) for n in names})

    def hidden(self, task: str, x: torch.Tensor) -> torch.Tensor:
        drop = self.dropout[task]
        for layer in self.layers:
            x = drop(torch.relu(layer[task](x)))
        return x

    def forward(self, task: str, x: torch.Tensor) -> torch.Tensor:
        return self.out[task](self.hidden(task, x))

    def shared_modules(self) -> list[nn.Module]:
        """Head layers used by more than one task (PCGrad treats them as shared)."""
        return [m for mods in self.shared_by_depth().values() for m in mods]

    def shared_by_depth(self) -> dict[int, list[nn.Module]]:
        """Hidden layer number (1 = nearest the encoder) -> its modules used by more than one task."""
        out = {}
        for depth, per_task in enumerate(self.layers, start=1):
            mods = list(per_task.values())
            shared = [m for m in {id(m): m for m in mods}.values() if sum(x is m for x in mods) > 1]
            if shared:
                out[depth] = shared
        return out
