"""A model bundle: one folder that predicts with no sweep, data or hub around it.

    best/
      model.pt        the best epoch's state dict (a slim bundle: without the frozen tensors)
      config.yaml     the resolved training config (`mtbert train --config` re-runs it)
      tokenizer/      the tokenizer in Hugging Face layout (for `tiny`, the one trained on the data)
      encoder/        the encoder's architecture (transformers config.json)
      bundle.json     vocabulary size and padding id, the format version; in a slim bundle,
                      `frozen`: where the frozen tensors come from and their digest

`load_model(dir)` rebuilds the model from these, on CPU or GPU: the architecture from
encoder/, the weights from model.pt (a slim bundle's frozen ones from the pretrained model it
names, below). config.yaml keeps the `model.name_or_path` it trained
from (so `mtbert train --config` re-runs it), but loading a self-contained bundle never reads
that folder or hub name: copied to another machine, without the pretrained model, it loads the
same. Predictions go through the same length-sorted batches as the training loop's dev
evaluation, so a bundle's dev scores are the run's to the last digit on the same device.

Slim bundles. Frozen layers (`freeze.layers`) never change, so a trial that stored them would
store the same pretrained tensors as every other trial of its sweep: 87 MB of MiniLM beside the
2-6 MB of heads a head-only trial trains. With `train.bundle: slim` (the default) best/ leaves them out
and bundle.json names them instead:

    "frozen": {"from": the model.name_or_path the run resolved (a local folder made absolute),
               "digest": frozen_digest of those tensors (the frozen-layer cache's key),
               "layers": how many encoder layers are frozen}

load_model then rebuilds them from that pretrained model (or from `encoder=`, e.g. the same
model in another folder) and checks the digest; a missing model or other weights are one line
that says so. `train.bundle: full` stores every tensor, and `mtbert bundle DIR [--output OUT]`
(make_self_contained) turns a slim bundle into a full one where its model is; a model logged to
MLflow is always self-contained. A run with nothing frozen stores every weight either way, and
so does a frozen `tiny` encoder: its random-init weights exist nowhere else. The resumable state
(a checkpoint's state.pt) follows the same rule, whatever train.bundle says: the run that
resumes it builds the same model, so it only needs the digest to check that.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

# 2: a slim bundle's bundle.json has `frozen`; format-1 bundles load as they did.
FORMAT = 2


class BundleError(ValueError):
    """A folder that is not a model bundle, or whose frozen weights cannot be had: one line
    naming the folder, what is wrong and what to do."""


def _source(name: str | None) -> str | None:
    """model.name_or_path as a run resolves it: a local folder made absolute, else as given."""
    from mtbert.hub import looks_local

    if name in (None, "tiny") or not looks_local(name):
        return name
    return str(Path(name).expanduser().resolve())


def _absolute_paths(raw: dict) -> dict:
    """The config with its relative file paths made absolute: `mtbert predict --split dev` then
    finds the data from any working directory, and `mtbert train --config` re-runs the same
    files. (Loading the model itself reads none of these.)"""
    def absolute(value):
        return str(Path(value).expanduser().resolve()) if value else value

    data = raw.get("data", {})
    data["dir"] = absolute(data.get("dir"))
    for files in (data.get("files") or {}).values():
        for split in ("train", "dev", "test"):
            files[split] = absolute(files.get(split))
    model = raw.get("model", {})
    if "name_or_path" in model:
        model["name_or_path"] = _source(model["name_or_path"])
    return raw


# ----------------------------------------------------------------------------- frozen tensors

def frozen_reference(model, cfg) -> dict | None:
    """What names the model's frozen tensors in a slim bundle or checkpoint (see the module
    docstring), or None when they must be stored: nothing is frozen, or no pretrained model
    holds them (tiny, or a frozen tensor the checkpoint lacked and the run initialised)."""
    from mtbert.train.frozen import frozen_digest

    if not model.frozen_from_checkpoint():
        return None
    return {"from": _source(cfg.model.name_or_path), "digest": frozen_digest(model),
            "layers": model.frozen_depth}


def stored_state(model, reference: dict | None) -> dict:
    """The state dict to store: without the frozen tensors when `reference` names them."""
    state = model.state_dict()
    if reference is None:
        return state
    frozen = model.frozen_keys()
    return {k: v for k, v in state.items() if k not in frozen}


def load_stored(model, weights: dict, reference: dict | None, where, source: str, remedy: str) -> None:
    """Load what stored_state stored into `model`, whose frozen tensors were built from
    `source`; their digest must be the one `reference` recorded. A full state dict loads too
    (a bundle made self-contained keeps its reference until its bundle.json is rewritten)."""
    from mtbert.train.frozen import frozen_digest

    if reference is None:
        model.load_state_dict(weights)
        return
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or not set(missing) <= model.frozen_keys():
        odd = sorted(unexpected) or sorted(set(missing) - model.frozen_keys())
        raise BundleError(f"{where}: its weights do not fit the model its config builds "
                          f"({len(odd)} keys such as {odd[0]}); it was written by another version of mtbert")
    digest = frozen_digest(model)
    if digest != reference["digest"]:
        raise BundleError(f"{where}: the frozen encoder weights in {source} are not the ones it was "
                          f"trained with (digest {digest}, expected {reference['digest']}); {remedy}")


# ----------------------------------------------------------------------------- save, load

def save_bundle(path: str | Path, model, cfg, tokenizer) -> Path:
    """Write the bundle of `model` (slim or full: train.bundle, see the module docstring)."""
    from mtbert.config import to_dict

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    reference = frozen_reference(model, cfg) if cfg.train.bundle == "slim" else None
    torch.save(stored_state(model, reference), path / "model.pt")
    (path / "config.yaml").write_text(yaml.safe_dump(_absolute_paths(to_dict(cfg)), sort_keys=False))
    tokenizer.save_pretrained(path / "tokenizer")
    model.hf_config.save_pretrained(path / "encoder")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    meta = {"format": FORMAT, "vocab_size": len(tokenizer), "pad_token_id": pad_id, "tasks": list(cfg.tasks)}
    if reference is not None:
        meta["frozen"] = reference
    (path / "bundle.json").write_text(json.dumps(meta, indent=2))
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


def load_model(path: str | Path, device: str = "auto", encoder: str | None = None) -> Bundle:
    """Load a bundle folder (a run's `best/`) for prediction, on `device` (auto: CUDA if any).
    A slim bundle reads its frozen weights from the pretrained model it names, or from
    `encoder` (a folder or hub name holding the same weights)."""
    from transformers import PreTrainedTokenizerFast

    from mtbert.config import build_config, read_yaml
    from mtbert.train import measure

    path = _bundle_folder(path)
    meta = json.loads((path / "bundle.json").read_text())
    if meta.get("format", 1) > FORMAT:
        raise BundleError(f"{path}: bundle format {meta['format']} is newer than this mtbert reads "
                          f"({FORMAT}); update mtbert")
    cfg = build_config(read_yaml(path / "config.yaml"), source=str(path / "config.yaml"))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path / "tokenizer"))
    dev = measure.pick_device(device)
    reference = meta.get("frozen")
    if reference is None:
        model, source, remedy = _stored_model(path, cfg, meta), str(path), ""
    else:
        source = encoder or reference["from"]
        remedy = (f"give the model it was trained from ({reference['from']}) with encoder= "
                  f"(mtbert predict --encoder FOLDER)")
        model = _model_from(path, cfg, meta, source)
    load_stored(model, torch.load(path / "model.pt", map_location="cpu", weights_only=True), reference,
                path, source, remedy)
    model.to(dev).eval()
    return Bundle(model, tokenizer, cfg, dev, path)


def _bundle_folder(path: str | Path) -> Path:
    path = Path(path)
    missing = [n for n in ("model.pt", "config.yaml", "tokenizer", "bundle.json") if not (path / n).exists()]
    if missing:
        raise BundleError(f"{path}: not a model bundle (missing {', '.join(missing)}); "
                          "give the best/ folder of a run")
    return path


def _stored_model(path: Path, cfg, meta: dict):
    """The model of a bundle that stores every weight: its architecture, random weights."""
    from transformers import AutoConfig

    from mtbert.model.encoder import encoder_config
    from mtbert.model.multitask import MultitaskModel

    if (path / "encoder" / "config.json").is_file():
        architecture = AutoConfig.from_pretrained(str(path / "encoder"))
    elif cfg.model.name_or_path == "tiny":  # bundles written before tiny ones had encoder/
        architecture = encoder_config(cfg, meta["vocab_size"])
    else:
        raise BundleError(f"{path}: not a model bundle (missing encoder/config.json, the "
                          f"architecture of {cfg.model.name_or_path})")
    return MultitaskModel(cfg, vocab_size=meta["vocab_size"], pad_token_id=meta["pad_token_id"],
                          encoder_architecture=architecture)


def _model_from(path: Path, cfg, meta: dict, source: str):
    """The model of a slim bundle: built from the pretrained `source`, whose weights stand for
    the frozen tensors the bundle left out (load_stored checks their digest)."""
    import copy

    from mtbert.config import ConfigError
    from mtbert.model.multitask import MultitaskModel

    built = copy.deepcopy(cfg)
    built.model.name_or_path = source
    try:
        return MultitaskModel(built, vocab_size=meta["vocab_size"], pad_token_id=meta["pad_token_id"])
    except (ConfigError, OSError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BundleError(
            f"{path}: a slim bundle whose frozen encoder weights are read from {source}, which does not "
            f"load here ({reason.removeprefix('model.name_or_path: ')}); put that model there, name its "
            f"folder with encoder= (mtbert predict --encoder FOLDER), or make the bundle self-contained "
            f"where the model is: mtbert bundle {path}") from None


def is_slim(path: str | Path) -> bool:
    """Whether the bundle at `path` names its frozen weights instead of storing them."""
    meta = Path(path) / "bundle.json"
    return meta.is_file() and "frozen" in json.loads(meta.read_text())


def make_self_contained(path: str | Path, output: str | Path | None = None, encoder: str | None = None) -> Path:
    """Store a slim bundle's frozen weights in it (in place, or in a copy at `output`), so it
    loads where its pretrained model is absent; returns the self-contained bundle's folder."""
    import shutil

    path = _bundle_folder(path)
    out = Path(output) if output is not None else path
    copy = out.resolve() != path.resolve()
    if copy and out.exists():
        raise BundleError(f"--output {out}: exists; give a new folder")
    model = load_model(path, device="cpu", encoder=encoder).model if is_slim(path) else None  # checks the digest
    if copy:
        shutil.copytree(path, out)
    if model is not None:
        # model.pt first: a bundle stopped between the two writes still loads (load_stored).
        tmp = out / ".model.pt.tmp"
        torch.save(model.state_dict(), tmp)
        tmp.replace(out / "model.pt")
        meta = json.loads((out / "bundle.json").read_text())
        del meta["frozen"]
        (out / "bundle.json").write_text(json.dumps(meta, indent=2))
    return out
