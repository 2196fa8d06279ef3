"""The sources of plug-in components with a setting of their own (a loss-weighting method, a
sampling strategy, a sharing regime), written into a module by the tests that load them as a user would
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

# A sharing regime from outside the package, in one file: its key, off value, load-time check,
# label and the model change (each task's top encoder layer made one module, over private
# layers below it: a shared top on private middles).
REGIME_PLUGIN = textwrap.dedent('''
    from mtbert.components import require
    from mtbert.errors import ConfigError
    from mtbert.model.sharing import Regime, register_regime


    class TiedTop(Regime):
        """The tasks' top encoder layers, one module: private layers below a shared top."""
        name = "tied_top"
        keys = {"tied_top": bool}
        off = {"tied_top": False}
        short = {"tied_top": "tied"}

        @classmethod
        def check(cls, sharing, cfg):
            require(not sharing.value("tied_top") or sharing.encoder_shared_layers is not None,
                    "sharing.tied_top: ties the tasks' private top layers; set sharing.encoder_shared_layers "
                    "below the encoder's depth")

        @classmethod
        def build(cls, model, sharing):
            if not sharing.value("tied_top"):
                return
            first, *others = model.task_layers.values()
            if not len(first):
                raise ConfigError("sharing.tied_top: no private encoder layer to tie "
                                  f"(sharing.encoder_shared_layers is all {model.num_layers})")
            for layers in others:
                layers[-1] = first[-1]


    register_regime(TiedTop)
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
