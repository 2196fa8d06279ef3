"""mtbert's own BERT (mtbert/model/bert.py) computes what transformers' BertModel computes, from
the same weights under the same names; other families still load through transformers; and a
run whose data the prepared index names never imports transformers at all."""
from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mtbert.config import ConfigError, build_config
from mtbert.model.bert import Bert, BertConfig
from mtbert.model.encoder import load_encoder
from mtbert.model.multitask import MultitaskModel

ROOT = Path(__file__).resolve().parents[2]
MINILM = ROOT / ".." / "shared" / "models" / "all-MiniLM-L6-v2"
MINBERT = ROOT / ".." / "shared" / "data" / "minbert"
TINY = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=40)


def batch(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (4, 18), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    mask[3, 4:] = 0
    types = torch.zeros_like(ids)
    types[:, 9:] = 1
    return ids, mask, types


def both(hf, mine, ids, mask, types):
    """Both encoders' last hidden states and the gradients of their sum, in eval mode."""
    out = []
    for model, run in ((hf, lambda: hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state),
                       (mine, lambda: mine(ids, mask, types))):
        model.eval().zero_grad()
        h = run()
        h.sum().backward()
        out.append((h.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}))
    return out


def test_same_outputs_and_gradients_as_transformers_bert():
    from transformers import BertConfig as HFConfig, BertModel

    torch.manual_seed(0)
    hf = BertModel(HFConfig(**TINY))
    mine = Bert(BertConfig(**TINY))
    assert set(mine.state_dict()) == set(hf.state_dict())
    assert mine.load_checkpoint({k: v.clone() for k, v in hf.state_dict().items()}) == set()
    (h1, g1), (h2, g2) = both(hf, mine, *batch(TINY["vocab_size"]))
    assert torch.equal(h1, h2)
    assert set(g1) == set(g2) and all(torch.allclose(g1[k], g2[k], atol=1e-6) for k in g1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ids, mask, types = batch(TINY["vocab_size"], seed=1)
        assert torch.equal(hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state,
                           mine(ids, mask, types))
    assert torch.equal(hf.pooler(h1), mine.pooler(h2))


def test_written_config_reads_back_in_transformers_and_here(tmp_path):
    from transformers import AutoConfig

    BertConfig(**TINY).save_pretrained(tmp_path)
    theirs = AutoConfig.from_pretrained(str(tmp_path))
    assert theirs.model_type == "bert" and theirs.hidden_size == 32 and theirs.num_hidden_layers == 2
    assert BertConfig.from_folder(tmp_path).to_dict() == {"architectures": ["BertModel"], **BertConfig(**TINY).to_dict()}


def pretrained_folder(tmp_path: Path, state: dict, **config) -> Path:
    from safetensors.torch import save_file

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", **TINY, **config}))
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder


def test_a_pretraining_checkpoint_loads_and_what_it_lacks_is_named(tmp_path):
    torch.manual_seed(0)
    source = Bert(BertConfig(**TINY), add_pooling_layer=False).state_dict()
    # A pretraining checkpoint's names: "bert." before each, LayerNorm's old gamma and beta,
    # and heads that an encoder does not read.
    renamed = {"bert." + k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in source.items()}
    renamed["cls.predictions.bias"] = torch.zeros(TINY["vocab_size"])
    cfg = build_config({"model": {"name_or_path": str(pretrained_folder(tmp_path, renamed))}})
    enc = load_encoder(cfg)
    assert isinstance(enc, Bert)
    assert enc.mtbert_new_params == {"pooler.dense.weight", "pooler.dense.bias"}
    assert all(torch.equal(enc.state_dict()[k], v) for k, v in source.items())


def test_a_checkpoint_of_another_shape_is_one_line(tmp_path):
    state = Bert(BertConfig(**TINY)).state_dict()
    folder = pretrained_folder(tmp_path, state, hidden_size=64)  # the config says 64, the weights 32
    with pytest.raises(ConfigError, match=r"^model.name_or_path: '.*model': embeddings\.\S+ is (\d+ x )?32 "
                                          r"in the checkpoint but (\d+ x )?64 by its config.json$"):
        load_encoder(build_config({"model": {"name_or_path": str(folder)}}))
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError, match=r"^model.name_or_path: cannot read the weights in .*model"):
        load_encoder(build_config({"model": {"name_or_path": str(folder)}}))


def test_another_family_still_loads_through_transformers(tmp_path):
    from transformers import RobertaConfig, RobertaModel

    folder = tmp_path / "roberta"
    RobertaModel(RobertaConfig(**{**TINY, "max_position_embeddings": 42}, type_vocab_size=1)).save_pretrained(folder)
    cfg = build_config({"model": {"name_or_path": str(folder), "max_length": 32}})
    model = MultitaskModel(cfg, vocab_size=TINY["vocab_size"])
    assert type(model.embeddings).__module__.startswith("transformers.")
    from mtbert.data.types import Batch, Encoded

    ids = torch.randint(3, 100, (2, 7))
    enc = Encoded(ids, torch.ones_like(ids), torch.zeros_like(ids))
    out = model([Batch("sst", [enc], torch.zeros(2, dtype=torch.long))])
    assert out["sst"].shape == (2, 5) and torch.isfinite(out["sst"]).all()


def test_schedules_match_transformers():
    from transformers import get_scheduler

    from mtbert.train.loop import lr_factor

    for ours, theirs in (("constant", "constant_with_warmup"), ("linear", "linear"), ("cosine", "cosine")):
        for warmup, total in ((0, 10), (3, 17), (5, 5)):
            p = [torch.nn.Parameter(torch.zeros(1))]
            a, b = torch.optim.SGD(p, lr=0.1), torch.optim.SGD(p, lr=0.1)
            sa = get_scheduler(theirs, a, num_warmup_steps=warmup, num_training_steps=total)
            sb = torch.optim.lr_scheduler.LambdaLR(b, functools.partial(lr_factor, schedule=ours, warmup=warmup,
                                                                         total=total))
            for _ in range(total + 2):
                assert a.param_groups[0]["lr"] == b.param_groups[0]["lr"], (ours, warmup, total)
                a.step(), b.step(), sa.step(), sb.step()


RUN = """
import json, sys
from mtbert.config import build_config
from mtbert.train.loop import train
cfg = build_config({"model": {"name_or_path": sys.argv[1], "max_length": 64},
                    "data": {"source": "cs224n", "dir": sys.argv[2], "max_train_examples": 64,
                             "max_dev_examples": 32, "cache_dir": sys.argv[3]},
                    "freeze": {"layers": -1}, "sampling": {"strategy": "tuple", "steps_per_epoch": 2},
                    "train": {"epochs": 1, "batch_size": 8, "device": "cpu", "bundle": "slim"}})
result = train(cfg, log=None, output_dir=sys.argv[4])
print(json.dumps({"transformers": sorted(m for m in sys.modules if m.split(".")[0] == "transformers")[:3],
                  "scores": [{k: e[k] for k in ("sst_acc", "para_acc", "sts_corr", "loss_sst", "model_size_mb",
                                                "params_total")} for e in result.epochs]}))
"""


@pytest.mark.shared
@pytest.mark.skipif(not (MINILM.is_dir() and MINBERT.is_dir()), reason="../shared model or data absent")
def test_a_run_from_the_prepared_index_never_imports_transformers(tmp_path):
    """The second process finds the tokenized data, the index and the frozen features: it trains
    and writes its slim bundle without transformers (seconds of every sweep worker's start)."""
    outs = []
    for n in (1, 2):
        proc = subprocess.run([sys.executable, "-c", RUN, str(MINILM.resolve()), str(MINBERT.resolve()),
                               str(tmp_path / "cache"), str(tmp_path / f"out{n}")],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert outs[0]["transformers"], "the first run loads the tokenizer to tokenize"
    assert outs[1]["transformers"] == []
    assert outs[0]["scores"] == outs[1]["scores"]  # the same run, whichever way it started
    from mtbert.bundle import load_model

    bundle = load_model(tmp_path / "out2" / "best")  # its tokenizer and frozen weights by reference
    assert len(bundle.tokenizer) == 30522 and bundle.pad_id == 0
