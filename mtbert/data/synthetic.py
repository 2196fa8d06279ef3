"""Built-in synthetic data: small, deterministic, and learnable by a tiny random-init encoder.

Data is generated from the task's *kind*, never its name, so any registered TaskSpec gets
data (a task added in a test or a plug-in included):

- single sentence: filler words plus polarity words worth -2, -1, +1 or +2; the label is a
  function of their sum (a class for multiclass/binary, a point in `label_range` for
  regression). Cancelling pairs (e.g. "superb ... dull ... bad") make the model add, not
  just spot a word.
- pair: sentence b keeps a fraction of sentence a's words. Binary: a light rewrite of a
  (synonyms, a swap) vs an unrelated sentence or one sharing a word or two. Regression and
  multiclass: the label follows the kept fraction.

The lexicon is fixed (real English words, so a pretrained tokenizer splits them sensibly);
the seed only drives sampling, so train and dev drawn with different seeds share one ground
truth. A little label noise keeps scores off the ceiling, so sharing choices can differ.
"""
from __future__ import annotations

import random

from mtbert.data.types import Example
from mtbert.tasks import TaskSpec

WEAK_POSITIVE = ("good nice fine pleasant decent warm charming solid fun sweet clever likable").split()
STRONG_POSITIVE = ("excellent brilliant superb wonderful fantastic masterful stunning delightful "
                   "outstanding magnificent gorgeous terrific").split()
WEAK_NEGATIVE = "bad dull weak flat bland tired clumsy slow messy stale silly thin".split()
STRONG_NEGATIVE = ("awful terrible dreadful horrible pathetic atrocious unbearable painful "
                   "disastrous abysmal lousy miserable").split()
POLARITY: dict[int, list[str]] = {1: WEAK_POSITIVE, 2: STRONG_POSITIVE,
                                  -1: WEAK_NEGATIVE, -2: STRONG_NEGATIVE}

# Pairs a paraphrase may swap; both words also serve as plain filler.
SYNONYMS: list[tuple[str, str]] = [
    ("film", "movie"), ("story", "tale"), ("begin", "start"), ("big", "large"),
    ("small", "little"), ("quick", "fast"), ("house", "home"), ("car", "automobile"),
    ("buy", "purchase"), ("help", "assist"), ("show", "display"), ("city", "town"),
    ("road", "street"), ("child", "kid"), ("job", "work"), ("answer", "reply"),
    ("ask", "inquire"), ("end", "finish"), ("choose", "pick"), ("near", "close"),
    ("shop", "store"), ("doctor", "physician"), ("rich", "wealthy"), ("quiet", "silent"),
    ("happy", "glad"), ("speak", "talk"), ("gift", "present"), ("student", "pupil"),
    ("ocean", "sea"), ("forest", "woods"), ("rock", "stone"), ("path", "trail"),
    ("money", "cash"), ("idea", "notion"), ("river", "stream"), ("hill", "slope"),
    ("teacher", "tutor"), ("trip", "journey"), ("meal", "dinner"), ("photo", "picture"),
]
FILLER = sorted({w for pair in SYNONYMS for w in pair} | set((
    "actor director scene plot camera screen music sound voice script ending character hero "
    "villain audience crowd season episode series chapter book page letter note word line "
    "question reason method system problem result number value price market company office "
    "manager worker team player coach game match field court ball goal score rule law judge "
    "country state government party leader member group family mother father brother sister "
    "friend neighbor village garden kitchen window door table chair bed room floor wall roof "
    "bridge tower station train plane boat ship engine machine computer phone screen network "
    "water fire air earth sun moon star sky cloud rain snow wind storm summer winter morning "
    "evening night day week month year hour minute history science language art culture "
    "animal dog cat horse bird fish tree flower grass apple bread coffee tea milk sugar salt "
    "walk run drive move carry hold open close read write listen watch learn teach travel "
    "build break bring send keep give take make find think know feel seem stay leave "
    "through after before during under over between around without within along across "
    "the a this that every some many few several another each other same different"
).split()) - {w for ws in POLARITY.values() for w in ws})

LABEL_NOISE = 0.05  # fraction of classification labels flipped to another class


def vocabulary() -> list[str]:
    """Every word the generator can emit (for tests and tokenizer sizing)."""
    return sorted(set(FILLER) | {w for ws in POLARITY.values() for w in ws})


def make_synthetic(task: TaskSpec, n: int, seed: int, mirrored: bool = False) -> list[Example]:
    """`n` examples for `task`, identical for identical (task kind/shape, n, seed). `mirrored`:
    the same examples with each label mirrored within its range (a planted conflicting task)."""
    rng = random.Random(seed)
    make = _pair_example if task.pair else _single_example
    examples = [make(task, rng) for _ in range(n)]
    if mirrored:
        examples = [Example(e.text, e.text2, mirror_label(task, e.label)) for e in examples]
    return examples


def mirror_label(task: TaskSpec, label: float | int) -> float | int:
    """The label at the other end of the task's range: class C-1-c, score lo+hi-y."""
    if task.kind == "regression":
        lo, hi = task.label_range
        return round(lo + hi - label, 3)
    classes = task.num_classes if task.kind == "multiclass" else 2
    return classes - 1 - label


# --------------------------------------------------------------------------- single sentence

def _filler(rng: random.Random, lo: int = 5, hi: int = 12) -> list[str]:
    return [rng.choice(FILLER) for _ in range(rng.randint(lo, hi))]


def _polarity_words(rng: random.Random, total: int) -> list[str]:
    """Polarity words whose values sum to `total`, sometimes padded with a cancelling pair."""
    values: list[int] = []
    rest = total
    while rest:
        step = min(abs(rest), rng.choice((1, 2)))
        values.append(step if rest > 0 else -step)
        rest -= values[-1]
    if rng.random() < 0.4 or not values:
        v = rng.choice((1, 2))
        values += [v, -v]
    return [rng.choice(POLARITY[v]) for v in values]


def _insert(rng: random.Random, words: list[str], extra: list[str]) -> list[str]:
    out = list(words)
    for w in extra:
        out.insert(rng.randint(0, len(out)), w)
    return out


def _sentence(words: list[str]) -> str:
    return " ".join(words) + " ."


def _single_example(task: TaskSpec, rng: random.Random) -> Example:
    if task.kind == "multiclass":
        label = rng.randrange(task.num_classes)
        total = label - task.num_classes // 2
    elif task.kind == "binary":
        label = rng.randrange(2)
        total = rng.choice((1, 2)) if label else rng.choice((-2, -1))
    else:
        total = rng.randint(-3, 3)
        label = _to_range(task, (total + 3) / 6, rng)
    words = _insert(rng, _filler(rng), _polarity_words(rng, total))
    return Example(_sentence(words), None, _noisy(task, label, rng))


# --------------------------------------------------------------------------- pairs

_SYN = {a: b for a, b in SYNONYMS} | {b: a for a, b in SYNONYMS}


def _rewrite(rng: random.Random, words: list[str]) -> list[str]:
    """A light paraphrase: about half the swappable words become synonyms, maybe one swap."""
    out = [_SYN[w] if w in _SYN and rng.random() < 0.5 else w for w in words]
    if len(out) > 2 and rng.random() < 0.3:
        i = rng.randrange(len(out) - 1)
        out[i], out[i + 1] = out[i + 1], out[i]
    return out


def _keep_fraction(rng: random.Random, words: list[str], keep: int) -> list[str]:
    """`words` with all but `keep` positions replaced by random filler."""
    kept = set(rng.sample(range(len(words)), keep))
    return [w if i in kept else rng.choice(FILLER) for i, w in enumerate(words)]


def _pair_example(task: TaskSpec, rng: random.Random) -> Example:
    a = _filler(rng, 4, 8)
    n = len(a)
    if task.kind == "binary":
        label = rng.randrange(2)
        if label:
            b = _rewrite(rng, a)
        elif rng.random() < 0.7:  # unrelated
            b = _filler(rng, n, n)
        else:  # a hard negative: shares a word or two
            b = _keep_fraction(rng, a, rng.randint(1, max(1, n // 3)))
    elif task.kind == "multiclass":
        c = rng.randrange(task.num_classes)
        keep = min(n, round(rng.uniform(c, c + 1) / task.num_classes * n))
        b = _keep_fraction(rng, a, keep)
        label = min(task.num_classes - 1, keep * task.num_classes // n)
    else:
        keep = rng.randint(0, n)
        b = _keep_fraction(rng, a, keep)
        label = _to_range(task, keep / n, rng)
    return Example(_sentence(a), _sentence(b), _noisy(task, label, rng))


# --------------------------------------------------------------------------- labels

def _to_range(task: TaskSpec, fraction: float, rng: random.Random) -> float:
    """Map [0, 1] into task.label_range with a little Gaussian noise, clipped to the range."""
    lo, hi = task.label_range
    value = lo + fraction * (hi - lo) + rng.gauss(0.0, 0.05 * (hi - lo))
    return round(min(hi, max(lo, value)), 3)


def _noisy(task: TaskSpec, label: float | int, rng: random.Random) -> float | int:
    if task.kind == "regression" or rng.random() >= LABEL_NOISE:
        return label
    classes = task.num_classes if task.kind == "multiclass" else 2
    return rng.choice([c for c in range(classes) if c != label])
