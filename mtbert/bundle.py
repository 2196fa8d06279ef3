"""A model bundle: one folder that predicts with no sweep, data or hub around it.

    best/
      model.pt        the best epoch's state dict (a slim bundle: without the frozen tensors,
                      and once its sweep trial has ended, losslessly compacted: compact_bundle)
      config.yaml     the resolved training config (`mtbert train --config` re-runs it)
      tokenizer/      the tokenizer in Hugging Face layout (for `tiny`, the one trained on the data;
                      a slim bundle names the pretrained model's own in bundle.json instead)
      encoder/        the encoder's architecture (transformers config.json)
      bundle.json     vocabulary size and padding id, the format version; in a slim bundle,
                      `frozen`: where the frozen tensors come from and their digest

`load_model(dir)` rebuilds the model from these, on CPU or GPU. Loading a self-contained
bundle never reads the `model.name_or_path` its config names, so it loads the same anywhere.
Predictions go through the same length-sorted batches as the training loop's dev evaluation,
so a bundle's dev scores are the run's to the last digit on the same device.

Slim bundles. Frozen layers (`freeze.layers`) are the same pretrained tensors in every trial of
a sweep (87 MB of MiniLM beside 2-6 MB of heads), so with `train.bundle: slim` (the default)
best/ leaves them out and bundle.json names them instead:

    "frozen": {"from": the model.name_or_path the run resolved (a local folder made absolute),
               "digest": frozen_digest of those tensors (the frozen-layer cache's key),
               "layers": how many encoder layers are frozen}

load_model then rebuilds them from that pretrained model (or from `encoder=`) and checks the
digest. `train.bundle: full` stores every tensor, and `mtbert bundle DIR [--output OUT]`
(make_self_contained) turns a slim bundle into a full one; a model logged to MLflow is always
self-contained. A run with nothing frozen, or a frozen `tiny` encoder (whose random-init
weights exist nowhere else), stores every weight either way. The resumable state (state.pt)
follows the slim rule whatever train.bundle says.
"""
from __future__ import annotations

import copy
import json
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from mtbert.data.types import Example
from mtbert.tasks import get_task
from mtbert.train.precision import autocast_for

# 2: a slim bundle's bundle.json has `frozen`; format-1 bundles load as they did.
# 3: a slim bundle may name its tokenizer (`tokenizer`: the pretrained model's own, by digest)
#    instead of storing it, and hold its weights compacted (compact_bundle).
FORMAT = 3
WEIGHTS = "model.pt"
CODEC = "planes-deflate-1"  # model.pt holding {"codec": CODEC, "tensors": [...]}: compacted weights


class BundleError(ValueError):
    """A folder that is not a model bundle, or whose frozen weights cannot be had."""


def _read_meta(meta: Path) -> dict:
    """bundle.json, or one line naming it (a copy cut short, a file edited by hand)."""
    try:
        found = json.loads(meta.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{meta}: unreadable ({exc}); the bundle is damaged") from None
    if not isinstance(found, dict):
        raise BundleError(f"{meta}: expected a JSON object; the bundle is damaged")
    return found


def save_atomic(obj, path: Path) -> None:
    """torch.save beside and rename: a run killed mid-write keeps the previous file, and a copy
    of the folder made by linking its files keeps its own."""
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


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

    data = raw["data"]
    data["dir"] = absolute(data["dir"])
    for files in data["files"].values():
        for split in ("train", "dev", "test"):
            files[split] = absolute(files[split])
    raw["model"]["name_or_path"] = _source(raw["model"]["name_or_path"])
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

def save_bundle(path: str | Path, model, cfg, tokenizer, weights_only: bool = False) -> Path:
    """Write the bundle of `model` (slim or full: train.bundle, see the module docstring).
    `weights_only`: `path` holds the bundle this same run wrote at an earlier epoch, whose
    other files (config, tokenizer, architecture, frozen reference) no epoch changes, so
    model.pt alone is rewritten (the training loop saves a bundle at every new best epoch)."""
    from mtbert.config import to_dict
    from mtbert.data.tokenize import pad_token_id, tokenizer_fingerprint

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    reference = frozen_reference(model, cfg) if cfg.train.bundle == "slim" else None
    save_atomic(stored_state(model, reference), path / WEIGHTS)
    if weights_only:
        return path
    (path / "config.yaml").write_text(yaml.safe_dump(_absolute_paths(to_dict(cfg)), sort_keys=False))
    if reference is None:
        tokenizer.save_pretrained(path / "tokenizer")
    elif (path / "tokenizer").is_dir():  # a full bundle's, written here before
        shutil.rmtree(path / "tokenizer")
    model.hf_config.save_pretrained(path / "encoder")
    meta = {"format": FORMAT, "vocab_size": len(tokenizer), "pad_token_id": pad_token_id(tokenizer),
            "tasks": list(cfg.tasks)}
    if reference is not None:
        # The tokenizer is the pretrained model's own, as the frozen weights are (a copy is
        # 0.7 MB beside MiniLM's 2-6 MB of heads): named by a digest that load_model checks.
        meta["frozen"] = reference
        meta["tokenizer"] = {"digest": tokenizer_fingerprint(tokenizer)}
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
        from mtbert.data.tokenize import pad_token_id

        return pad_token_id(self.tokenizer)

    def encode(self, task: str, examples: list):
        """Examples -> the tokenized dataset the model reads (unlabelled ones get label 0)."""
        from mtbert.data.tokenize import encode_examples

        examples = [e if e.label is not None else Example(e.text, e.text2, 0, e.id) for e in examples]
        return encode_examples(self.tokenizer, examples, get_task(task), self.config.pairs.encoding,
                               self.config.model.max_length)

    @torch.no_grad()
    def predict_dataset(self, ds) -> tuple[torch.Tensor, list[int]]:
        """(predictions in length-sorted order, that order) for one task's dataset: the
        batches of the training loop's evaluate(), so scores computed on them match it."""
        from mtbert.data.tokenize import collate
        from mtbert.model.multitask import pack

        task = get_task(ds.task)
        order = sorted(range(len(ds)), key=lambda i: len(ds.sides[0][i]))
        size = self.config.train.eval_batch_size
        # The loop's rule (train.precision): bf16 autocast where training used it on this device kind.
        autocast = autocast_for(self.config.train.precision, self.device)[1]
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
        if task not in self.tasks:
            raise BundleError(f"{self.path}: task '{task}' is not one of the bundle's tasks {self.tasks}")
        spec = get_task(task)
        if spec.pair and (texts2 is None or len(texts2) != len(texts)):
            raise BundleError(f"task '{task}' compares two sentences: give texts2, one per text")
        if not texts:
            return []
        examples = [Example(t, texts2[i] if spec.pair else None, 0) for i, t in enumerate(texts)]
        sorted_preds, order = self.predict_dataset(self.encode(task, examples))
        return [value for _, value in sorted(zip(order, sorted_preds.cpu().tolist()))]

    def score(self, ds) -> float:
        """The dev metric of one labelled dataset, computed as the training loop does."""
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
    meta = _read_meta(path / "bundle.json")
    if meta.get("format", 1) > FORMAT:
        raise BundleError(f"{path}: bundle format {meta['format']} is newer than this mtbert reads "
                          f"({FORMAT}); update mtbert")
    cfg = build_config(read_yaml(path / "config.yaml"), source=str(path / "config.yaml"))
    dev = measure.pick_device(device)
    reference = meta.get("frozen")
    if reference is None:
        model, source, remedy = _stored_model(path, cfg, meta), str(path), ""
    else:
        source = encoder or reference["from"]
        remedy = (f"give the model it was trained from ({reference['from']}) with encoder= "
                  f"(mtbert predict --encoder FOLDER)")
        model = _model_from(path, cfg, meta, source)
    if (path / "tokenizer").is_dir():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path / "tokenizer"))
    else:
        tokenizer = _named_tokenizer(path, meta, source, remedy)
    load_stored(model, read_weights(path), reference, path, source, remedy)
    model.to(dev).eval()
    return Bundle(model, tokenizer, cfg, dev, path)


def _named_tokenizer(path: Path, meta: dict, source: str, remedy: str):
    """A slim bundle's tokenizer: the pretrained model's at `source`, if it is the one the run
    trained with."""
    from mtbert.data.tokenize import pretrained_tokenizer, tokenizer_fingerprint
    from mtbert.errors import DataError

    try:
        tokenizer = pretrained_tokenizer(source)
    except DataError as exc:
        raise BundleError(f"{path}: a slim bundle whose tokenizer is read from {source}, which does not "
                          f"load here ({str(exc).removeprefix('model.name_or_path: ')}); {remedy}") from None
    digest = tokenizer_fingerprint(tokenizer)
    if digest != meta["tokenizer"]["digest"]:
        raise BundleError(f"{path}: the tokenizer in {source} is not the one it was trained with (digest "
                          f"{digest}, expected {meta['tokenizer']['digest']}); {remedy}")
    return tokenizer




# ----------------------------------------------------------------------------- compacted weights

def compact_bundle(path: str | Path) -> bool:
    """Store a slim bundle's weights losslessly compacted (model.pt, rewritten): each float32 tensor's
    bytes split into planes, the highest (the sign and the exponent's top seven bits: few
    distinct values in trained weights) deflated, the rest kept as they are. Trained MiniLM
    heads shrink by about 15% and load bit for bit. (The next plane, the mantissa's top,
    deflated by under 1% for as much time again, so it is left.) A sweep's driver does it once
    a trial has ended. Returns whether it did; a full bundle (seconds to compact for 15%) stays
    as it is."""
    from mtbert.data.cache import atomic_write

    path = Path(path)
    if not (path / WEIGHTS).is_file() or not is_slim(path):
        return False
    state = torch.load(path / WEIGHTS, map_location="cpu", weights_only=True)
    if state.get("codec") == CODEC:
        return False
    atomic_write(path / WEIGHTS, lambda tmp: torch.save(_compacted(state), tmp))
    return True


def _compacted(state: dict) -> dict:
    seen: dict[tuple, str] = {}
    out = {"codec": CODEC, "tensors": []}
    for name, t in state.items():
        t = t.detach().cpu()
        ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        entry = {"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
        if t.numel() and ident in seen:  # shared by reference (an S head layer): stored once
            entry["same_as"] = seen[ident]
        else:
            seen[ident] = name
            size = t.element_size()
            planes = t.contiguous().view(torch.uint8).reshape(-1, size).T.contiguous().numpy()
            high = 1 if t.is_floating_point() and size >= 4 else size
            entry["raw"] = torch.from_numpy(planes[: size - high].copy()).reshape(-1)
            entry["deflated"] = torch.frombuffer(bytearray(zlib.compress(planes[size - high:].tobytes(), 1)),
                                                 dtype=torch.uint8)
        out["tensors"].append(entry)
    return out


def _expanded(packed: dict) -> dict:
    state: dict[str, torch.Tensor] = {}
    for e in packed["tensors"]:
        if "same_as" in e:
            state[e["name"]] = state[e["same_as"]]
            continue
        dtype = getattr(torch, e["dtype"])
        size = torch.empty((), dtype=dtype).element_size()
        high = np.frombuffer(zlib.decompress(e["deflated"].numpy().tobytes()), dtype=np.uint8)
        planes = np.concatenate([e["raw"].numpy(), high]).reshape(size, -1)
        flat = torch.from_numpy(np.ascontiguousarray(planes.T).reshape(-1)).view(dtype)
        state[e["name"]] = flat.reshape(e["shape"]).clone()
    return state


def read_weights(path: str | Path) -> dict:
    """The bundle's stored state dict, compacted (compact_bundle) or not."""
    state = torch.load(Path(path) / WEIGHTS, map_location="cpu", weights_only=True)
    return _expanded(state) if state.get("codec") == CODEC else state


def _bundle_folder(path: str | Path) -> Path:
    path = Path(path)
    meta = path / "bundle.json"
    named = meta.is_file() and "tokenizer" in _read_meta(meta)
    missing = [n for n in (WEIGHTS, "config.yaml", "bundle.json", *(() if named else ("tokenizer",)))
               if not (path / n).exists()]
    if missing:
        raise BundleError(f"{path}: not a model bundle (missing {', '.join(missing)}); "
                          "give the best/ folder of a run")
    return path


def _stored_model(path: Path, cfg, meta: dict):
    """The model of a bundle that stores every weight: its architecture, random weights."""
    from mtbert.model.encoder import config_of, encoder_config
    from mtbert.model.multitask import MultitaskModel

    if (path / "encoder" / "config.json").is_file():
        architecture = config_of(str(path / "encoder"))
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
    from mtbert.config import ConfigError
    from mtbert.errors import first_line
    from mtbert.model.multitask import MultitaskModel

    built = copy.deepcopy(cfg)
    built.model.name_or_path = source
    try:
        return MultitaskModel(built, vocab_size=meta["vocab_size"], pad_token_id=meta["pad_token_id"])
    except (ConfigError, OSError) as exc:
        reason = first_line(exc)
        raise BundleError(
            f"{path}: a slim bundle whose frozen encoder weights are read from {source}, which does not "
            f"load here ({reason.removeprefix('model.name_or_path: ')}); put that model there, name its "
            f"folder with encoder= (mtbert predict --encoder FOLDER), or make the bundle self-contained "
            f"where the model is: mtbert bundle {path}") from None


def is_slim(path: str | Path) -> bool:
    """Whether the bundle at `path` names its frozen weights instead of storing them."""
    meta = Path(path) / "bundle.json"
    return meta.is_file() and "frozen" in _read_meta(meta)


def make_self_contained(path: str | Path, output: str | Path | None = None, encoder: str | None = None) -> Path:
    """Store a slim bundle's frozen weights in it (in place, or in a copy at `output`), so it
    loads where its pretrained model is absent; returns the self-contained bundle's folder."""
    path = _bundle_folder(path)
    out = Path(output) if output is not None else path
    elsewhere = out.resolve() != path.resolve()
    if elsewhere and out.exists():
        raise BundleError(f"--output {out}: exists; give a new folder")
    bundle = load_model(path, device="cpu", encoder=encoder) if is_slim(path) else None  # checks the digests
    if elsewhere:
        shutil.copytree(path, out)
    if bundle is not None:
        if not (out / "tokenizer").is_dir():
            bundle.tokenizer.save_pretrained(out / "tokenizer")
        # model.pt first: a bundle stopped between the two writes still loads (load_stored).
        save_atomic(bundle.model.state_dict(), out / WEIGHTS)
        meta = _read_meta(out / "bundle.json")
        meta.pop("frozen")
        meta.pop("tokenizer", None)
        (out / "bundle.json").write_text(json.dumps(meta, indent=2))
    return out
