"""The benchmark scripts still run: a few steps of each on the tiny model (the figures they
print are only meaningful at their default sizes)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_throughput_bench_prints_every_ratio():
    out = run("throughput.py", "--models", "tiny", "--steps", "1", "--rounds", "1")
    for title in ("packed trunk vs naive loop", "bi vs cross pairs", "pcgrad on vs off", "famo vs static",
                  "3-bert buckets vs one batch", "1-bert buckets vs one batch", "cache build vs step forward"):
        assert title in out, out
    assert out.count("ratio") == 7, out


@pytest.mark.slow
def test_orchestration_bench_two_sizes_against_a_server():
    # The sleep trainable measures one real tiny trial first, so the real path runs too.
    out = run("orchestration.py", "--trials", "2,3", "--trainable", "sleep", "--sleep-s", "0.2", "--steps", "2", "--server")
    assert "sleep trainable: 0.20 s per trial (--sleep-s; the real trial took" in out, out
    assert "MLflow server http://127.0.0.1:" in out, out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["2"], ["3"])]
    assert [(r[0], r[1]) for r in rows] == [("2", "0"), ("3", "0")], out  # sizes, none failed
    assert all(len(r) == 10 and float(r[-1]) > 0 for r in rows), out  # every column, calls counted
    for line in ("growth exponent of MLflow time in trials", "writer CPU:", "overhead ratio at 3 trials / at 2"):
        assert line in out, out


@pytest.mark.slow
def test_leaderboard_bench_times_both_readers():
    out = run("leaderboard.py", "--runs", "40", "--generic")
    for line in ("40 child runs written", "SQL reader", "mlflow.search_runs", "build and sort the table",
                 "mtbert leaderboard (end to end)"):
        assert line in out, out


MINILM = ROOT / ".." / "shared" / "models" / "all-MiniLM-L6-v2"


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.skipif(not MINILM.is_dir(), reason="../shared/models/all-MiniLM-L6-v2 absent")
def test_recipe_bench_prints_every_arm_and_mfu():
    from mtbert.train.measure import cpu_has_bf16

    out = run("recipe.py", "--steps", "1", "--rounds", "1")
    # bf16 arms only where the CPU multiplies bf16 natively (emulated bf16 times the emulation).
    arms = ("hand fp32", "mtbert fp32") + (("hand bf16", "mtbert bf16") if cpu_has_bf16() else ())
    for arm in arms:
        assert arm in out, out
    assert out.count("seq/s   MFU") == len(arms) and "mtbert fp32 vs hand fp32" in out, out
    assert ("vs hand bf16" in out) == cpu_has_bf16(), out


def test_recipe_bench_repeats_every_sentence_and_keeps_the_rows(tmp_path, monkeypatch):
    from mtbert.config import build_config
    from mtbert.data.readers import load_splits
    from tests.e2e.test_bundle import write_cs224n

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from recipe import repeated_data

    (tmp_path / "src").mkdir()
    (tmp_path / "out").mkdir()
    for j, task in enumerate(("sst", "para", "sts")):
        write_cs224n(tmp_path / "src", task, "train", 5, j)
        write_cs224n(tmp_path / "src", task, "dev", 5, j + 3)
    read = {}
    for folder in (tmp_path / "src", repeated_data(3, tmp_path / "src", tmp_path / "out")):
        cfg = build_config({"data": {"source": "cs224n", "dir": str(folder)}})
        splits, _ = load_splits(cfg)
        read[folder.name] = {task: train for task, (train, _dev) in splits.items()}
    for task, before in read["src"].items():
        after = read["out"][task]
        assert [e.label for e in after] == [e.label for e in before]
        assert [e.text for e in after] == [" ".join([e.text.strip()] * 3) for e in before]
        if before[0].text2 is not None:
            assert [e.text2 for e in after] == [" ".join([e.text2.strip()] * 3) for e in before]


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.skipif(not MINILM.is_dir(), reason="../shared/models/all-MiniLM-L6-v2 absent")
def test_frozen_cache_bench_compares_both_depths():
    out = run("frozen_cache.py", "--examples", "24", "--epochs", "1")
    assert "freeze = 3" in out and "freeze = all" in out and out.count("epoch ratio") == 2, out


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.skipif(not MINILM.is_dir(), reason="../shared/models/all-MiniLM-L6-v2 absent")
def test_footprint_bench_keeps_one_model_per_trial_and_heads_only_for_head_only():
    out = run("footprint.py", "--examples", "16", "--steps", "1", "--epochs", "1")
    assert "3 of 3 trials finished" in out, out
    rows = {line[:19].strip(): line[19:].split() for line in out.splitlines() if line.startswith("  ")}
    assert set(rows) == {"trial", "fine-tuned", "head-only", "frozen reference"}, out
    assert float(rows["fine-tuned"][-1]) <= 1.1, out  # folder / model: the model once
    assert float(rows["head-only"][2]) < 10 and float(rows["frozen reference"][2]) < 5, out  # MB


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.skipif(not MINILM.is_dir(), reason="../shared/models/all-MiniLM-L6-v2 absent")
def test_overhead_bench_splits_every_trial_slot():
    out = run("overhead.py", "--regimes", "2", "--seeds", "1", "--epochs", "1", "--steps", "1",
              "--examples", "16", "--dev-examples", "8", "--concurrency", "1")
    assert "2 of 2 trials finished" in out, out
    table = [line.split() for line in out.splitlines()
             if line.startswith("  ") and not line.startswith(("  median", "  split"))]
    assert table[0][:2] == ["trial", "slot"], out
    rows = table[1:]
    assert len(rows) == 2 and all(len(r) == 13 for r in rows), out  # the trial's key, then every column
    for r in rows:
        slot, fixed = float(r[1]), float(r[11])
        assert slot > 0 and 0 <= fixed <= slot, out
    assert "median fixed cost per trial" in out and "MB per trial on disk" in out, out
    assert "warm trials alone" in out and "from Tune's start to the first trial" in out, out
    # One trial at a time: Tune runs both on the one worker it keeps (reuse_actors).
    assert "| 1 worker process(es)" in out, out


def test_gpu_check_says_in_one_line_that_there_is_no_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: bench/gpu.sh would run for minutes")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), str(tmp_path / "out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "bench/gpu.sh: no CUDA device visible to python3's torch: nothing to check"], proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_weighting_bench_puts_each_method_beside_static():
    out = run("weighting.py", "--methods", "pcgrad,upgrad,famo", "--steps", "1", "--rounds", "1",
              "--solve-repeats", "2")
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] and
            line.split()[0] in ("static", "pcgrad", "upgrad", "famo")}
    assert list(rows) == ["static", "pcgrad", "upgrad", "famo"], out
    assert rows["static"][2] == "1.00x" and rows["static"][3] == "0", out
    assert rows["pcgrad"][3] == rows["upgrad"][3] == "2" and rows["famo"][3] == "0", out  # 3 tasks: T - 1 passes
    for label in ("pcgrad: mtbert", "pcgrad: TorchJD", "cagrad: mtbert (SLSQP)", "cagrad: TorchJD (cvxpy)"):
        assert label in out, out
