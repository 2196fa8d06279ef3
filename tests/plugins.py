"""The sources of plug-in components with a setting of their own (a loss-weighting method, a
sampling strategy), written into a module by the tests that load them as a user would
(`plugins: [<module>]`), and what their fixtures share: writing one, then forgetting it."""
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

WEIGHTING_PLUGIN = textwrap.dedent('''
    from dataclasses import dataclass

    import torch

    from mtbert.components import require
    from mtbert.train.weighting import Weighting, register_weighting


    class Scaled(Weighting):
        """Every task at one fixed weight, the `scale` setting."""
        name = "scaled"

        @dataclass
        class Settings(Weighting.Settings):
            scale: float = 0.5

            def check(self, key):
                require(0 < self.scale <= 1, f"{key}.scale: must be in (0, 1], got {self.scale}")

        def backward(self, losses, shared):
            (self.settings.scale * torch.stack(list(losses.values()))).sum().backward()
            return {t: torch.tensor(self.settings.scale) for t in losses}


    register_weighting(Scaled)
''')

# A method on per-task gradients from outside the package: GradientWeighting gathers them and
# counts their cost, the plug-in gives only its coefficients (from their Gram matrix).
GRADIENT_PLUGIN = textwrap.dedent('''
    from dataclasses import dataclass

    import torch

    from mtbert.components import require
    from mtbert.train.weighting import GradientWeighting, register_weighting


    class UnitNorm(GradientWeighting):
        """Each task's shared gradient scaled to norm `scale` / T."""
        name = "unit_norm"

        @dataclass
        class Settings(GradientWeighting.Settings):
            scale: float = 1.0

            def check(self, key):
                require(self.scale > 0, f"{key}.scale: must be > 0, got {self.scale}")

        def coefficients(self, grads, tasks):
            norms = grads.gram().diagonal().sqrt().clamp_min(1e-12)
            return self.settings.scale / len(tasks) / norms


    register_weighting(UnitNorm)
''')

SAMPLING_PLUGIN = textwrap.dedent('''
    from dataclasses import dataclass

    from mtbert.components import require
    from mtbert.data.samplers import Strategy, register_strategy


    class Only(Strategy):
        """Every step trains one task, the `task` setting."""
        name = "only"

        @dataclass
        class Settings(Strategy.Settings):
            task: str = "sst"

            def check(self, key):
                require(bool(self.task), f"{key}.task: must name a task")

        @classmethod
        def check_config(cls, settings, key, cfg):
            require(settings.task in cfg.tasks, f"{key}.task: '{settings.task}' is not one of tasks {cfg.tasks}")

        def probabilities(self, sizes, epoch, epochs):
            return {t: float(t == self.settings.task) for t in sizes}


    register_strategy(Only)
''')


@contextmanager
def installed(folder: Path, module: str, source: str, registry: dict, name: str):
    """`source` as `folder/<module>.py` (the fixture puts `folder` on the path or makes it the
    working directory); afterwards its component and module are forgotten, so that no other
    test sees them."""
    (folder / f"{module}.py").write_text(source)
    try:
        yield module
    finally:
        registry.pop(name, None)
        sys.modules.pop(module, None)
