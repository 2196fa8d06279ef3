"""The CUDA paths on a real GPU: bf16 autocast, memory read from CUDA, the frozen-layer cache
on the device, exact resume, and a bundle trained on the GPU predicting on the CPU.

Skipped where no CUDA device is visible (CI has none); `bench/gpu.sh` runs them on a GPU
machine. They need only torch and transformers, not Ray or MLflow."""
import os
import shutil
from pathlib import Path

import pytest
import torch

# cuBLAS picks its reduction order per workspace; a fixed workspace makes its results repeat,
# which exact resume needs. Set before the first CUDA call of the process.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

from mtbert.bundle import load_model  # noqa: E402
from mtbert.config import build_config  # noqa: E402
from mtbert.predict import predict_split  # noqa: E402
from mtbert.train.loop import train  # noqa: E402
from mtbert.train.precision import use_bf16  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")

SMALL = {"train.device": "cuda", "sampling.strategy": "proportional", "sampling.steps_per_epoch": 12,
         "train.epochs": 3, "data.synthetic.train_size": 240, "data.synthetic.dev_size": 60,
         "heads.dropout": 0.3, "model.max_length": 32, "train.batch_size": 8}
KEEP = ("epoch", "sst_acc", "para_acc", "sts_corr", "overall", "loss_sst", "loss_para", "loss_sts", "best_epoch")


def config(tmp_path: Path, **over):
    return build_config({}, {**SMALL, "data.cache_dir": str(tmp_path / "cache"), **over})


def figures(result) -> list[dict]:
    return [{k: e[k] for k in KEEP} for e in result.epochs]


@pytest.fixture
def deterministic():
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def test_auto_precision_is_bf16_on_cuda_and_the_run_learns(tmp_path):
    assert use_bf16("auto", torch.device("cuda"))
    # The settings of the CPU's learning test (tests/e2e/test_train.py), on the GPU.
    learns = {"sampling.strategy": "tuple", "sampling.steps_per_epoch": 100, "train.epochs": 3, "optim.lr": 1e-3,
              "train.device": "cuda", "data.cache_dir": str(tmp_path / "cache")}
    result = train(build_config({}, learns), output_dir=tmp_path / "run", log=None)
    assert next(result.model.parameters()).device.type == "cuda"
    m = result.metrics
    # Chance: 0.2 for 5-class SST, 0.5 for paraphrase, r = 0 for STS (tests/e2e/test_train.py).
    assert m["sst_acc"] > 0.35 and m["para_acc"] > 0.7 and m["sts_corr"] > 0.5, m
    # Peak memory comes from CUDA's allocator, not the process's resident set.
    assert 0 < m["peak_memory_mb"] < torch.cuda.get_device_properties(0).total_memory / 2**20
    assert (tmp_path / "run" / "best" / "bundle.json").is_file()


def test_resume_on_cuda_ends_as_the_straight_run(tmp_path, deterministic):
    cfg = config(tmp_path)
    straight = train(cfg, log=None)

    class Stop(Exception):
        pass

    kept = tmp_path / "ckpt"

    def reporter(metrics, checkpoint_dir):
        if metrics["epoch"] == 1:
            shutil.copytree(checkpoint_dir, kept)
            raise Stop

    with pytest.raises(Stop):
        train(cfg, reporter=reporter, log=None)
    resumed = train(cfg, reporter=lambda m, c: None, resume_from=kept, log=None)
    assert figures(resumed) == figures(straight)


def test_a_bundle_trained_on_cuda_scores_the_same_on_the_cpu(tmp_path):
    # fp32, so the CPU computes what the GPU did up to summation order.
    result = train(config(tmp_path, **{"train.precision": "fp32"}), output_dir=tmp_path / "run", log=None)
    best = result.epochs[result.metrics["best_epoch"] - 1]
    for device in ("cuda", "cpu"):
        bundle = load_model(tmp_path / "run" / "best", device=device)
        assert next(bundle.model.parameters()).device.type == device
        scores = {p.task: p.score for p in predict_split(bundle, "dev", tmp_path / device, log=lambda _m: None)}
        assert scores["sst"] == best["sst_acc"] and scores["para"] == best["para_acc"], device
        assert scores["sts"] == pytest.approx(best["sts_corr"], abs=1e-4), device


def test_head_only_run_reads_the_frozen_layers_from_a_cache_on_the_gpu(tmp_path):
    lines = []
    cfg = config(tmp_path, **{"freeze.layers": -1})
    cached = train(cfg, log=lines.append)
    assert any("frozen layers" in line for line in lines), lines
    uncached = train(config(tmp_path, **{"freeze.layers": -1, "train.frozen_cache_mb": 0}), log=None)
    # The same model computed two ways: bf16 rounding of the stored layers may move a score a little.
    for a, b in zip(figures(cached), figures(uncached)):
        assert a["overall"] == pytest.approx(b["overall"], abs=0.05)


def test_bf16_attention_keeps_off_cudnn_which_replans_for_every_shape():
    from torch.profiler import ProfilerActivity, profile

    from mtbert.train.precision import autocast_for

    _, context = autocast_for("auto", torch.device("cuda"))
    with profile(activities=[ProfilerActivity.CPU]) as prof, context():
        for length in (17, 23, 31):  # a new longest row each call, as in training
            q = torch.randn(8, 12, length, 64, device="cuda")
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
    names = [e.key for e in prof.key_averages()]
    assert any("attention" in n for n in names) and not any("cudnn" in n for n in names), names


def test_tf32_runs_its_matmuls_in_tf32_and_restores_the_process_setting(tmp_path):
    from mtbert.train.precision import label, matmul_precision

    assert label("tf32", torch.device("cuda")) == "tf32" and label("tf32", torch.device("cpu")) == "fp32"
    before = torch.get_float32_matmul_precision()
    with matmul_precision("tf32", torch.device("cuda")):
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == before
    result = train(config(tmp_path, **{"train.precision": "tf32"}), log=None)
    assert torch.get_float32_matmul_precision() == before  # a sweep worker's next trial starts clean
    m = result.metrics
    assert next(result.model.parameters()).dtype == torch.float32
    # Throughput and MFU are read against the TF32 peak, which is many times the fp32 one.
    assert m["tokens_per_s"] > 0 and 0 < m["mfu"] < 1, m
