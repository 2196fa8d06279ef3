"""A model bundle: one folder that predicts with no sweep, data or hub around it.

    best/
      model.pt        the best epoch's state dict
      config.yaml     the resolved training config (`mtbert train --config` re-runs it)
      tokenizer/      the tokenizer in Hugging Face layout (for `tiny`, the one trained on the data)
      encoder/        the encoder's architecture (transformers config.json)
      bundle.json     vocabulary size and padding id, the format version

`load_model(dir)` rebuilds the model from these alone, on CPU or GPU: the architecture from
encoder/, every weight from model.pt. config.yaml keeps the `model.name_or_path` it trained
from (so `mtbert train --config` re-runs it), but loading never reads that folder or hub name:
a bundle copied to another machine, without the pretrained model, loads the same. Predictions go through the
same length-sorted batches as the training loop's dev evaluation, so a bundle's dev scores
are the run's to the last digit on the same device.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

FORMAT = 1


class BundleError(ValueError):
    """A folder that is not a model bundle: one line naming the folder and what is missing."""


def _absolute_paths(raw: dict) -> dict:
    """The config with its relative file paths made absolute: `mtbert predict --split dev` then
    finds the data from any working directory, and `mtbert train --config` re-runs the same
    files. (Loading the model itself reads none of these.)"""
    from mtbert.hub import looks_local

    def absolute(value):
        return str(Path(value).expanduser().resolve()) if value else value

    data = raw.get("data", {})
    data["dir"] = absolute(data.get("dir"))
    for files in (data.get("files") or {}).values():
        for split in ("train", "dev", "test"):
            files[split] = absolute(files.get(split))
    model = raw.get("model", {})
    if model.get("name_or_path") not in (None, "tiny") and looks_local(model["name_or_path"]):
        model["name_or_path"] = absolute(model["name_or_path"])
    return raw


def save_bundle(path: str | Path, model, cfg, tokenizer) -> Path:
    from mtbert.config import to_dict

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path / "model.pt")
    (path / "config.yaml").write_text(yaml.safe_dump(_absolute_paths(to_dict(cfg)), sort_keys=False))
    tokenizer.save_pretrained(path / "tokenizer")
    model.hf_config.save_pretrained(path / "encoder")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    (path / "bundle.json").write_text(json.dumps(
        {"format": FORMAT, "vocab_size": len(tokenizer), "pad_token_id": pad_id,
         "tasks": list(cfg.tasks)}, indent=2))
    return path


@dataclass
class Bundle:
    """A loaded bundle: the model in eval mode, its tokenizer and config."""
    model: torch.nn.Module
    tokenizer: object
    config: object  # mtbert.config.Config
    device: torch.device
    path: Path

    @property
    def tasks(self) -> list[str]:
        return list(self.config.tasks)

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def _autocast(self):
        # The loop's rule (train.precision): bf16 autocast where training used it on this device kind.
        from mtbert.train.loop import autocast_for

        return autocast_for(self.config.train.precision, self.device)[1]

    def encode(self, task: str, examples: list):
        """Examples -> the tokenized dataset the model reads (unlabelled ones get label 0)."""
        from mtbert.data.tokenize import encode_examples
        from mtbert.data.types import Example
        from mtbert.tasks import get_task

        examples = [e if e.label is not None else Example(e.text, e.text2, 0, e.id) for e in examples]
        return encode_examples(self.tokenizer, examples, get_task(task), self.config.pairs.encoding,
                               self.config.model.max_length)

    @torch.no_grad()
    def predict_dataset(self, ds) -> tuple[torch.Tensor, list[int]]:
        """(predictions in length-sorted order, that order) for one task's dataset: the
        batches of the training loop's evaluate(), so scores computed on them match it."""
        from mtbert.model.multitask import pack
        from mtbert.data.tokenize import collate
        from mtbert.tasks import get_task

        task = get_task(ds.task)
        order = sorted(range(len(ds)), key=lambda i: len(ds.sides[0][i]))
        size = self.config.train.eval_batch_size
        autocast = self._autocast()
        preds = []
        for at in range(0, len(order), size):
            batch = collate(ds, order[at:at + size], self.pad_id)
            packed = pack([batch]).to(self.device)
            with autocast():
                out = self.model.from_embeddings(packed, self.model.embed(packed))[ds.task]
            preds.append(task.predict(out.float()))
        return torch.cat(preds), order

    def predict(self, task: str, texts: list[str], texts2: list[str] | None = None) -> list:
        """Predictions for raw text, in input order: a class (sst), 0/1 (para) or a
        similarity on the label scale (sts, 0..5)."""
        from mtbert.data.types import Example
        from mtbert.tasks import get_task

        if task not in self.tasks:
            raise BundleError(f"{self.path}: task '{task}' is not one of the bundle's tasks {self.tasks}")
        spec = get_task(task)
        if spec.pair and (texts2 is None or len(texts2) != len(texts)):
            raise BundleError(f"task '{task}' compares two sentences: give texts2, one per text")
        if not texts:
            return []
        examples = [Example(t, texts2[i] if spec.pair else None, 0) for i, t in enumerate(texts)]
        sorted_preds, order = self.predict_dataset(self.encode(task, examples))
        out = [None] * len(order)
        for value, i in zip(sorted_preds.cpu().tolist(), order):
            out[i] = value
        return out

    def score(self, ds) -> float:
        """The dev metric of one labelled dataset, computed as the training loop does."""
        from mtbert.tasks import get_task

        preds, order = self.predict_dataset(ds)
        labels = ds.labels[torch.as_tensor(order, dtype=torch.long)].to(self.device)
        return get_task(ds.task).score(preds, labels)


def load_model(path: str | Path, device: str = "auto") -> Bundle:
    """Load a bundle folder (a run's `best/`) for prediction, on `device` (auto: CUDA if any)."""
    from transformers import AutoConfig, PreTrainedTokenizerFast

    from mtbert.config import build_config, read_yaml
    from mtbert.model.encoder import encoder_config
    from mtbert.model.multitask import MultitaskModel
    from mtbert.train import measure

    path = Path(path)
    missing = [n for n in ("model.pt", "config.yaml", "tokenizer", "bundle.json") if not (path / n).exists()]
    if missing:
        raise BundleError(f"{path}: not a model bundle (missing {', '.join(missing)}); "
                          "give the best/ folder of a run")
    meta = json.loads((path / "bundle.json").read_text())
    cfg = build_config(read_yaml(path / "config.yaml"), source=str(path / "config.yaml"))
    if (path / "encoder" / "config.json").is_file():
        architecture = AutoConfig.from_pretrained(str(path / "encoder"))
    elif cfg.model.name_or_path == "tiny":  # bundles written before tiny ones had encoder/
        architecture = encoder_config(cfg, meta["vocab_size"])
    else:
        raise BundleError(f"{path}: not a model bundle (missing encoder/config.json, the "
                          f"architecture of {cfg.model.name_or_path})")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path / "tokenizer"))
    dev = measure.pick_device(device)
    model = MultitaskModel(cfg, vocab_size=meta["vocab_size"], pad_token_id=meta["pad_token_id"],
                           encoder_architecture=architecture)
    model.load_state_dict(torch.load(path / "model.pt", map_location="cpu", weights_only=True))
    model.to(dev).eval()
    return Bundle(model, tokenizer, cfg, dev, path)
