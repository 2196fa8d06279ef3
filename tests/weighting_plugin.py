"""The source of a loss-weighting plug-in with a setting of its own, written into a module by
the tests that load it as a user would (`plugins: [<module>]`)."""
import textwrap

PLUGIN = textwrap.dedent('''
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
