"""Tokenizers, tokenized datasets, dynamic-padding collation and the tokenization cache.

`prepare()` tokenizes each split once and stores it under `data.cache_dir`, keyed by a hash of
everything that decides the token ids (tokenizer, task, pair encoding, max_length, examples),
so a sweep's trials share it and nothing goes stale.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mtbert.config import Config, to_dict
from mtbert.data.cache import ProcessMemo, atomic_write, build_once, files_digest, folder_stamp
from mtbert.data.readers import DataError, input_files, load_splits, resolve_files
from mtbert.data.types import Batch, BadRows, Encoded, Example
from mtbert.errors import first_line
from mtbert.hub import pretrained_source
from mtbert.tasks import TaskSpec, get_task

if TYPE_CHECKING:  # transformers is imported where a tokenizer is loaded, not with this module
    from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4, in this order
TINY_VOCAB_SIZE = 8192  # a cap: the synthetic data needs a few hundred entries, real data fills it
CACHE_VERSION = 1  # bump when the stored layout changes


# --------------------------------------------------------------------------- tokenizers

def get_tokenizer(cfg: Config, texts: Iterable[str] = ()) -> PreTrainedTokenizerFast:
    """The tokenizer for `model.name_or_path`: "tiny" trains a WordPiece on `texts` (cached);
    anything else is a hub name or a local directory in Hugging Face layout."""
    name = cfg.model.name_or_path
    if name == "tiny":
        return _tiny_tokenizer(list(texts), Path(cfg.data.cache_dir))
    return pretrained_tokenizer(name)


MIN_VOCAB = 100  # tokens of a pretrained tokenizer that is more than its special tokens


def pretrained_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """The fast tokenizer of `name` (a hub name or a local folder), or a DataError naming
    model.name_or_path where it does not load, is not a fast one, has no padding token or no
    vocabulary beyond its special tokens."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    source, kwargs = pretrained_source(name, DataError)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as exc:
        first = first_line(exc)
        raise DataError(f"model.name_or_path: cannot load a tokenizer from '{name}' ({first})") from None
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise DataError(f"model.name_or_path: '{name}' has no fast (Rust) tokenizer")
    if tokenizer.pad_token_id is None:
        raise DataError(f"model.name_or_path: the tokenizer of '{name}' has no padding token")
    if len(tokenizer) < MIN_VOCAB:  # its special tokens alone: every word would be [UNK]
        raise DataError(f"model.name_or_path: the tokenizer of '{name}' has {len(tokenizer)} tokens, not a "
                        f"vocabulary (at least {MIN_VOCAB}); its tokenizer files are missing or wrong")
    return tokenizer


def pad_token_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def _hash_texts(texts: Sequence[str]) -> str:
    h = hashlib.sha256(f"tiny-wordpiece-v2:{TINY_VOCAB_SIZE}:{SPECIAL_TOKENS}".encode())
    for t in texts:
        h.update(t.encode("utf-8", "surrogatepass"))
        h.update(b"\x1e")
    return h.hexdigest()


def _tiny_tokenizer(texts: list[str], cache_dir: Path) -> PreTrainedTokenizerFast:
    if not texts:
        raise DataError("model.name_or_path: tiny trains its tokenizer on the training texts; none given")
    path = cache_dir / f"tokenizer-tiny-{_hash_texts(texts)[:20]}.json"
    build_once(path, lambda p: p if p.is_file() else None, lambda: train_wordpiece(texts).to_str(),
               lambda text, tmp: tmp.write_text(text, encoding="utf-8"))
    # Always load from the file: every trial then uses the same stored vocabulary.
    return _wrap(path)


def train_wordpiece(texts: Iterable[str], vocab_size: int = TINY_VOCAB_SIZE):
    """A BERT-style uncased WordPiece tokenizer (tokenizers.Tokenizer) built from `texts`:
    every character seen (alone and as a "##" continuation), then whole words by frequency
    (ties alphabetical) up to `vocab_size`. Not the library's WordPieceTrainer: it breaks merge
    ties in hash order, and trials of one sweep must agree on token ids."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words: Counter[str] = Counter()
    for text in texts:
        words.update(w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
    chars: Counter[str] = Counter()
    for word, n in words.items():
        for c in word:
            chars[c] += n
    room = vocab_size - len(SPECIAL_TOKENS)
    alphabet = _by_count(chars)[:room // 2]
    vocab = SPECIAL_TOKENS + alphabet + ["##" + c for c in alphabet]
    vocab += [w for w in _by_count(words) if len(w) > 1][:vocab_size - len(vocab)]

    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    cls, sep = SPECIAL_TOKENS.index("[CLS]"), SPECIAL_TOKENS.index("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece()
    return tok


def _by_count(counts: Counter[str]) -> list[str]:
    """Keys by falling count, ties alphabetical: the same order in every process."""
    return [k for k, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def _wrap(path: Path) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=str(path), pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=512,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerFast) -> str:
    """A digest of what decides a tokenizer's ids: its vocabulary, normalizer, pre-tokenizer,
    model and post-processor. Not its truncation and padding, which tokenizing with
    truncation=True switches on in the tokenizer as a side effect. It keys the tokenized
    data here and names the tokenizer a slim bundle was trained with (bundle.py)."""
    # Serialising MiniLM's vocabulary takes tens of milliseconds per bundle a sweep worker
    # writes: kept with the tokenizer object while its vocabulary size stays the same.
    kept = _FINGERPRINTS.get(tokenizer)
    if kept is not None and kept[0] == len(tokenizer):
        return kept[1]
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec.pop("truncation", None)
    spec.pop("padding", None)
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    try:
        _FINGERPRINTS[tokenizer] = (len(tokenizer), digest)
    except TypeError:  # an object that takes no weak reference: computed every time
        pass
    return digest


_FINGERPRINTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class LazyTokenizer:
    """A pretrained model's tokenizer, loaded at its first use beyond its size, padding id and
    fingerprint. A run whose tokenized data the prepared index names (a sweep worker's first
    trial, say) trains and writes a slim bundle with those three alone, and loading
    transformers' tokenizer classes cost it 0.6 s (a 2-core AVX512-BF16 EPYC)."""

    def __init__(self, name: str, size: int, pad_id: int, fingerprint: str):
        self.name, self.size, self.pad_token_id = name, size, pad_id
        _FINGERPRINTS[self] = (size, fingerprint)

    def __len__(self) -> int:
        return self.size

    def loaded(self) -> PreTrainedTokenizerFast:
        if "_tokenizer" not in self.__dict__:
            self._tokenizer = pretrained_tokenizer(self.name)
        return self._tokenizer

    def __getattr__(self, attr: str):  # anything else: the tokenizer itself
        if attr.startswith("__") or attr == "_tokenizer":
            raise AttributeError(attr)
        return getattr(self.loaded(), attr)

    def __call__(self, *args, **kwargs):
        return self.loaded()(*args, **kwargs)


# --------------------------------------------------------------------------- datasets

@dataclass(frozen=True)
class _Packed:
    """One side of a dataset as flat tensors, so collate gathers a batch without Python loops."""
    ids: torch.Tensor  # (total tokens,) long
    types: torch.Tensor  # (total tokens,) long
    offsets: torch.Tensor  # (N,) long: start of sequence i in ids
    lengths: torch.Tensor  # (N,) long


def _pack(seqs: list[list[int]], types: list[list[int]]) -> _Packed:
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    return _Packed(torch.tensor(list(itertools.chain.from_iterable(seqs)), dtype=torch.long),
                   torch.tensor(list(itertools.chain.from_iterable(types)), dtype=torch.long),
                   torch.cumsum(lengths, 0) - lengths, lengths)


def _unpack(flat: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    ends = torch.cumsum(lengths.long(), 0)
    starts = (ends - lengths.long()).tolist()
    return list(map(flat.tolist().__getitem__, map(slice, starts, ends.tolist())))


@dataclass
class Truncation:
    """What `max_length` cut from one task's split, counted at tokenization."""
    task: str
    split: str
    max_length: int
    rows: int = 0
    rows_cut: int = 0  # rows with at least one sequence longer than max_length
    tokens: int = 0  # tokens the untruncated sequences would have
    tokens_lost: int = 0
    p95_length: int = 0  # the max_length that would keep 95% of rows whole

    @property
    def lost_share(self) -> float:
        return self.tokens_lost / self.tokens if self.tokens else 0.0

    def summary(self) -> str:
        """One line, e.g. 'reviews train: 990 of 1000 rows cut at 64 tokens (71% of tokens lost;
        95% of rows fit in 480: task_options.reviews.max_length)'."""
        return (f"{self.task} {self.split}: {self.rows_cut} of {self.rows} rows cut at {self.max_length} "
                f"tokens ({self.lost_share:.0%} of tokens lost; 95% of rows fit in {self.p95_length}: "
                f"task_options.{self.task}.max_length)")

    def to_dict(self) -> dict:
        return {"task": self.task, "split": self.split, "max_length": self.max_length, "rows": self.rows,
                "rows_cut": self.rows_cut, "tokens": self.tokens, "tokens_lost": self.tokens_lost,
                "lost_share": round(self.lost_share, 6), "p95_length": self.p95_length}


@dataclass(eq=False)
class TaskDataset:
    """One task's split, tokenized and unpadded. Read-only: collate reads a packed copy."""
    task: str
    sides: list[list[list[int]]]  # sides[s][i]: token ids of example i on side s
    type_ids: list[list[list[int]]]
    labels: torch.Tensor
    _packed: list[_Packed] | None = field(default=None, init=False, repr=False)
    truncation: dict | None = field(default=None, repr=False)  # Truncation.to_dict() of this split

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def packed(self) -> list[_Packed]:
        if self._packed is None:
            self._packed = [_pack(s, t) for s, t in zip(self.sides, self.type_ids)]
        return self._packed


def encode_examples(tokenizer: PreTrainedTokenizerFast, examples: list[Example], task: TaskSpec,
                    encoding: str, max_length: int) -> TaskDataset:
    """Tokenize `examples`: one side for single sentences and cross-encoded pairs
    ([CLS] a [SEP] b [SEP], token types 0/1), two sides for bi-encoded pairs."""
    if encoding not in ("cross", "bi"):
        raise DataError(f"pairs.encoding: expected cross or bi, got '{encoding}'")
    texts = [e.text for e in examples]
    full: list[list[int]] = []  # per side: untruncated length of each row

    def run(a: list[str], b: list[str] | None = None) -> tuple[list[list[int]], list[list[int]]]:
        out = tokenizer(a, b, truncation=True, max_length=max_length, return_token_type_ids=True,
                        return_attention_mask=False)
        ids = out["input_ids"]
        # Only a row that reached max_length can have been cut: tokenize those again whole.
        lengths = [len(x) for x in ids]
        at = [i for i, n in enumerate(lengths) if n >= max_length]
        if at:
            whole = tokenizer([a[i] for i in at], [b[i] for i in at] if b is not None else None,
                              truncation=False, return_attention_mask=False, return_token_type_ids=False,
                              verbose=False)["input_ids"]
            for i, w in zip(at, whole):
                lengths[i] = len(w)
        full.append(lengths)
        return ids, out["token_type_ids"]

    if not task.pair:
        encoded = [run(texts)]
    elif encoding == "cross":
        encoded = [run(texts, [e.text2 or "" for e in examples])]
    else:
        encoded = [run(texts), run([e.text2 or "" for e in examples])]
    dtype = torch.float32 if task.kind == "regression" else torch.long
    labels = torch.tensor([e.label for e in examples], dtype=dtype)
    ds = TaskDataset(task.name, [ids for ids, _ in encoded], [tt for _, tt in encoded], labels)
    ds.truncation = truncation_counts(task.name, "", max_length, full).to_dict()
    return ds


def truncation_counts(task: str, split: str, max_length: int, full: list[list[int]]) -> Truncation:
    """Counts from the untruncated lengths of each side (`full[side][row]`)."""
    t = Truncation(task, split, max_length, rows=len(full[0]) if full else 0)
    longest = [max(side[i] for side in full) for i in range(t.rows)]
    t.rows_cut = sum(n > max_length for n in longest)
    t.tokens = sum(sum(side) for side in full)
    t.tokens_lost = sum(max(0, n - max_length) for side in full for n in side)
    if longest:
        ranked = sorted(longest)
        t.p95_length = ranked[max(0, math.ceil(0.95 * len(ranked)) - 1)]
    return t


def padded_positions(offsets: torch.Tensor, lengths: torch.Tensor, idx: torch.Tensor,
                     size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) positions in a flat store of `size` rows of the sequences `idx`, padded to the
    longest, and their mask. Padding positions point at some in-range row, for the mask to blank."""
    lengths = lengths[idx]
    steps = torch.arange(int(lengths.max()))
    mask = steps[None, :] < lengths[:, None]
    return (offsets[idx][:, None] + steps[None, :]).clamp_(max=size - 1), mask


def collate(ds: TaskDataset, indices: Sequence[int], pad_id: int) -> Batch:
    """A batch padded to its own longest sequence (per side), not to max_length."""
    idx = torch.as_tensor(indices, dtype=torch.long)
    if idx.numel() == 0:
        raise ValueError(f"collate: empty batch of task '{ds.task}'")
    inputs = []
    for p in ds.packed:
        pos, mask = padded_positions(p.offsets, p.lengths, idx, p.ids.numel())
        inputs.append(Encoded(torch.where(mask, p.ids[pos], pad_id), mask.long(), p.types[pos] * mask))
    return Batch(ds.task, inputs, ds.labels[idx])


# --------------------------------------------------------------------------- cache

def cache_key(fingerprint: str, examples: list[Example], task: TaskSpec, encoding: str,
              max_length: int) -> str:
    h = hashlib.sha256(f"v{CACHE_VERSION}|{fingerprint}|{task.name}|{task.kind}|"
                       f"{encoding if task.pair else '-'}|{max_length}|".encode())
    for e in examples:
        h.update(f"{e.text}\x1f{e.text2}\x1f{e.label!r}\x1e".encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _save(ds: TaskDataset, path: Path) -> None:
    state = {"task": ds.task, "labels": ds.labels,
             "ids": [p.ids.to(torch.int32) for p in ds.packed],
             "types": [p.types.to(torch.int8) for p in ds.packed],
             "lengths": [p.lengths.to(torch.int32) for p in ds.packed], "truncation": ds.truncation}
    torch.save(state, path)


def _load(path: Path) -> TaskDataset | None:
    """The stored dataset, or None when the file is missing or unreadable (then re-encode)."""
    if not path.is_file():
        return None
    try:
        state = torch.load(path, weights_only=True)
        sides = zip(state["ids"], state["types"], state["lengths"])
        packed = [_Packed(ids.long(), types.long(), torch.cumsum(n.long(), 0) - n.long(), n.long())
                  for ids, types, n in sides]
        ds = TaskDataset(state["task"], [_unpack(p.ids, p.lengths) for p in packed],
                         [_unpack(p.types, p.lengths) for p in packed], state["labels"])
        ds.truncation = dict(state["truncation"])  # a file from before the counts: a miss
    except Exception:  # a truncated or foreign file is a cache miss, not an error
        return None
    ds._packed = packed
    return ds


def encode_cached(tokenizer: PreTrainedTokenizerFast, fingerprint: str, examples: list[Example],
                  task: TaskSpec, encoding: str, max_length: int, cache_dir: Path,
                  split: str) -> tuple[TaskDataset, str]:
    """The split tokenized, and its digest (the key its file in `cache_dir` is named by)."""
    digest = cache_key(fingerprint, examples, task, encoding, max_length)[:24]
    ds, _ = build_once(cache_dir / _stored_name(task.name, split, digest), _load,
                       lambda: encode_examples(tokenizer, examples, task, encoding, max_length), _save)
    return _of_split(ds, split), digest


def _stored_name(task: str, split: str, digest: str) -> str:
    return f"{task}-{split}-{digest}.pt"


def _of_split(ds: TaskDataset, split: str) -> TaskDataset:
    """A stored dataset's truncation counts say which split they are of (the file is keyed by
    content alone: a train and a dev split with the same rows share it)."""
    ds.truncation = {**ds.truncation, "split": split}
    return ds


# --------------------------------------------------------------------------- prepare

@dataclass
class Prepared:
    tokenizer: PreTrainedTokenizerFast
    train: dict[str, TaskDataset]
    dev: dict[str, TaskDataset]
    bad_rows: list[BadRows]
    # split -> task -> its tokenization-cache key (24 hex digits), which names its stored file:
    # what identifies these rows as tokenized for this model
    digests: dict[str, dict[str, str]] = field(default_factory=dict)

    def truncation(self) -> list[Truncation]:
        """Per task and split, train first; what max_length (per task) cut."""
        return [Truncation(**{k: v for k, v in ds.truncation.items() if k != "lost_share"})
                for part in (self.train, self.dev) for ds in part.values() if ds.truncation]

    def data_report(self) -> list[str]:
        """The bad-row summaries and every split that lost rows to truncation."""
        return ([b.summary() for b in self.bad_rows if b.total]
                + [t.summary() for t in self.truncation() if t.rows_cut])


# The last data setups this process prepared: a sweep worker's next trial reads the same ones.
_PREPARED = ProcessMemo(size=2)


def _prepared_key(cfg: Config) -> tuple | None:
    """Everything that decides what prepare() returns (config, file contents, the tokenizer's
    folder as it is now); None where it cannot be said: a file or folder prepare() will report."""
    try:
        files = input_files(cfg)
        name = cfg.model.name_or_path
        tokenizer: tuple = (name,)
        if name != "tiny":  # tiny's is trained on the training texts: they are in the key
            source, _ = pretrained_source(name, DataError)
            tokenizer = (name, source, folder_stamp(Path(source)))
    except (DataError, KeyError, ValueError, OSError):
        return None
    spec = {"tasks": list(cfg.tasks), "data": to_dict(cfg)["data"], "encoding": cfg.pairs.encoding,
            "max_length": {t: cfg.max_length(t) for t in cfg.tasks}}
    return json.dumps(spec, sort_keys=True, default=str), tokenizer, files_digest(files)


def prepare(cfg: Config, log: Callable[[str], None] | None = print) -> Prepared:
    """Load every task's splits, get the tokenizer and tokenize (once per content: cached on
    disk, and kept in the process for its next run: treat the result as read-only).
    Relative paths in cfg resolve against the current directory."""
    resolve_files(cfg)  # in place, as load_splits would: the config records what was read
    key = _prepared_key(cfg)
    prepared = _PREPARED.get(key) if key is not None else None
    if prepared is None:
        index = _index_path(cfg, key)
        prepared = (index and _from_index(cfg, index)) or _prepare(cfg, index)
        if key is not None:
            _PREPARED.keep(key, prepared)
    if log is not None:
        for line in prepared.data_report():
            log(line)
    return prepared


def _prepare(cfg: Config, index: Path | None = None) -> Prepared:
    splits, bad_rows = load_splits(cfg)
    train_texts = [t for train, _ in splits.values() for e in train for t in (e.text, e.text2) if t]
    tokenizer = get_tokenizer(cfg, train_texts)
    fingerprint = tokenizer_fingerprint(tokenizer)
    cache_dir = Path(cfg.data.cache_dir)
    parts: dict[str, dict[str, TaskDataset]] = {"train": {}, "dev": {}}
    digests: dict[str, dict[str, str]] = {"train": {}, "dev": {}}
    for name, (train_ex, dev_ex) in splits.items():
        task = get_task(name)
        for split, examples in (("train", train_ex), ("dev", dev_ex)):
            parts[split][name], digests[split][name] = encode_cached(
                tokenizer, fingerprint, examples, task, cfg.pairs.encoding, cfg.max_length(name), cache_dir, split)
    if index is not None:
        record = {"fingerprint": fingerprint, "size": len(tokenizer), "pad_token_id": pad_token_id(tokenizer),
                  "digests": digests, "bad_rows": [asdict(b) for b in bad_rows]}
        try:
            atomic_write(index, lambda tmp: tmp.write_text(json.dumps(record)))
        except DataError:  # the index saves time, nothing else: a run goes on without it
            pass
    return Prepared(tokenizer, parts["train"], parts["dev"], bad_rows, digests)


def _index_path(cfg: Config, key: tuple | None) -> Path | None:
    """Where prepare() notes which cached files a setup read, for the next process that prepares
    it. Only for a tokenizer in a local folder, whose files the key stamps: a hub name's can
    change under the same name, and tiny's is trained on the texts themselves."""
    tokenizer = key[1] if key is not None else ()  # (name, folder, its stamp); tiny's is (name,)
    if len(tokenizer) < 3 or not tokenizer[2]:
        return None
    digest = hashlib.blake2b(repr((CACHE_VERSION, key)).encode(), digest_size=12).hexdigest()
    return Path(cfg.data.cache_dir) / f"prepared-{digest}.json"


def _from_index(cfg: Config, index: Path) -> Prepared | None:
    """What an earlier process prepared from the same files, config and tokenizer folder (the
    index's name is their digest), without reading the data files into examples, nor serialising
    the tokenizer for its fingerprint, nor loading it (LazyTokenizer): on the CS224N data the
    first two were 0.6 s of every sweep worker's first trial (a 2-core AVX512-BF16 EPYC;
    docs/benchmarks.md). None (prepare afresh) where the index or a file it names is gone or
    unreadable, or an older index lacks what this one records (the tokenizer's size, digests)."""
    try:
        record = json.loads(index.read_text())
        bad_rows = [BadRows(b["file"], b["rows_read"], b["counts"], [tuple(e) for e in b["examples"]])
                    for b in record["bad_rows"]]
        parts: dict[str, dict[str, TaskDataset]] = {"train": {}, "dev": {}}
        for split, digests in record["digests"].items():
            for task, digest in digests.items():
                ds = _load(Path(cfg.data.cache_dir) / _stored_name(task, split, digest))
                if ds is None:
                    return None
                parts[split][task] = _of_split(ds, split)
        tokenizer = LazyTokenizer(cfg.model.name_or_path, int(record["size"]), int(record["pad_token_id"]),
                                  record["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if any(set(part) != set(cfg.tasks) for part in parts.values()):
        return None
    return Prepared(tokenizer, parts["train"], parts["dev"], bad_rows, record["digests"])
