"""The real pretrained encoder from ../shared loads offline and shares layers by reference."""
from pathlib import Path

import pytest
import torch

from mtbert.config import build_config
from mtbert.data.tokenize import get_tokenizer
from mtbert.data.types import Batch, Encoded
from mtbert.model.multitask import MultitaskModel

MINILM = Path(__file__).resolve().parents[2] / ".." / "shared" / "models" / "all-MiniLM-L6-v2"
pytestmark = [pytest.mark.shared,
              pytest.mark.skipif(not MINILM.is_dir(), reason="../shared/models/all-MiniLM-L6-v2 absent")]


def test_minilm_hybrid_shares_bottom_half_and_keeps_pretrained_weights():
    from transformers import AutoModel

    cfg = build_config({}, {"model.name_or_path": str(MINILM), "sharing.encoder_shared_layers": 3})
    model = MultitaskModel(cfg)
    reference = AutoModel.from_pretrained(str(MINILM))
    assert model.num_layers == 6 and len(model.shared_layers) == 3
    assert all(len(v) == 3 for v in model.task_layers.values())
    # Per-task copies start from the pretrained weights, as distinct tensors.
    ref_w = reference.encoder.layer[4].attention.self.query.weight
    copies = [model.task_layers[t][1].attention.self.query.weight for t in ("sst", "para", "sts")]
    assert all(torch.equal(w, ref_w) for w in copies)
    assert len({w.data_ptr() for w in copies}) == 3

    tok = get_tokenizer(cfg)
    enc = tok(["a lovely film", "a dull one"], ["a fine movie", "not good"], padding=True, return_tensors="pt")
    pair = Encoded(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    single = tok(["a lovely film", "a dull one"], padding=True, return_tensors="pt")
    sst = Encoded(single["input_ids"], single["attention_mask"], single["token_type_ids"])
    model.eval()
    with torch.no_grad():
        out = model([Batch("sst", [sst], torch.tensor([3, 1])),
                     Batch("para", [pair, pair], torch.tensor([1, 0]))])
    assert out["sst"].shape == (2, 5) and out["para"].shape == (2, 1)
    assert torch.isfinite(out["sst"]).all()
