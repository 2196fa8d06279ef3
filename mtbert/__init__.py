"""mtbert: multitask BERT sharing regimes as a sweep.

The library knows nothing of Ray or MLflow: `mtbert.train(config, reporter)` trains one
configuration and returns a Result; `orchestration` runs it as Ray Tune trials.
"""
__version__ = "0.1.0"


def train(*args, **kwargs):
    from mtbert.train.loop import train as _train
    return _train(*args, **kwargs)


def load_model(path, device: str = "auto", encoder: str | None = None):
    """A trained model bundle (a run's best/ folder), ready to predict: see mtbert/bundle.py
    (`encoder`: where a slim bundle's frozen weights are, if not where it says)."""
    from mtbert.bundle import load_model as _load
    return _load(path, device, encoder)
