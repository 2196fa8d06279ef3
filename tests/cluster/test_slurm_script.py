"""The batch script of `mtbert sweep slurm`, as text: every option lands where it should, a bad
option is one line, and the script is valid bash. tests/cluster/test_slurm.py runs it on a real
SLURM."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestration.errors import SweepError
from orchestration.run.slurm import SlurmJob, job_script, time_limit_s

ROOT = Path(__file__).resolve().parents[2]


def job(**changes) -> SlurmJob:
    fields = dict(file="/shared/sweeps/smoke.yaml", workdir="/shared/work", sweep_name="smoke")
    return SlurmJob(**{**fields, **changes})


def directives(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_every_option_lands_in_its_place() -> None:
    script = job_script(job(nodes=3, cpus_per_node=8, gpus_per_node=2, time="2-00:00:00", partition="gpu",
                            account="nlp-lab", sbatch=["mem=64G", "--constraint=a100", "#SBATCH --qos=long"],
                            setup=["module load python/3.11", "source ~/venvs/mtbert/bin/activate"],
                            sweep_args=["--set", "optim.lr=1e-4", "--smoke", "--tracking-uri", "http://mlflow:5000"],
                            mtbert="python -m mtbert.cli", ray="python -m ray.scripts.scripts", grace_s=300,
                            job_name="mops", ray_tmp="/scratch/local"))
    assert directives(script) == [
        "--job-name=mops", "--nodes=3", "--ntasks-per-node=1", "--cpus-per-task=8", "--gpus-per-node=2",
        "--time=2-00:00:00", "--partition=gpu", "--account=nlp-lab", "--chdir=/shared/work",
        "--output=slurm-%j.out", "--open-mode=append", "--requeue", "--signal=B:TERM@300",
        "--mem=64G", "--constraint=a100", "--qos=long"]
    # sbatch reads directives only up to the first command: they all come first.
    first_command = next(i for i, line in enumerate(script.splitlines()) if line and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(script.splitlines()) if line.startswith("#SBATCH"))
    lines = script.splitlines()
    assert lines.index("module load python/3.11") < lines.index("source ~/venvs/mtbert/bin/activate") \
        < next(i for i, line in enumerate(lines) if "start --head" in line)
    assert ("python -m mtbert.cli sweep run /shared/sweeps/smoke.yaml --name=\"$sweep\" "
            "--address=\"$head_ip:$port\" --set optim.lr=1e-4 --smoke --tracking-uri http://mlflow:5000 &") in script
    assert 'python -m mtbert.cli sweep resume "$sweep" --address="$head_ip:$port" &' in script
    assert script.count("python -m ray.scripts.scripts start") == 2 and "--num-gpus=2" in script
    assert script.count("--temp-dir=/scratch/local/ray-$SLURM_JOB_ID-") == 2
    assert "sweep=smoke-$SLURM_JOB_ID" in script
    assert "<<" not in script and ">>" not in script


def test_defaults_name_no_path_of_this_machine() -> None:
    script = job_script(job())
    assert directives(script) == [
        "--job-name=mtbert-smoke", "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=2",
        "--chdir=/shared/work", "--output=slurm-%j.out", "--open-mode=append", "--requeue", "--signal=B:TERM@180"]
    assert "mtbert sweep run /shared/sweeps/smoke.yaml" in script and "\n  ray start --head" in script
    assert str(ROOT) not in script and sys.executable not in script


def test_a_requeued_run_resumes_and_a_stopped_one_requeues() -> None:
    script = job_script(job())
    restart = script.index('if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then')
    assert restart < script.index("sweep resume") < script.index("else") < script.index("sweep run")
    assert "trap 'on_signal requeue TERM' TERM" in script and "trap 'on_signal stop INT' INT" in script
    assert 'if [ "$stop" = requeue ]; then' in script and 'scontrol requeue "$SLURM_JOB_ID"' in script


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_script_is_valid_bash(tmp_path: Path) -> None:
    path = tmp_path / "job.sh"
    path.write_text(job_script(job(nodes=2, setup=["export A=1"], sweep_args=["--set", "x=it's"])))
    out = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("changes, message", [
    (dict(nodes=0), "--nodes: must be >= 1, got 0"),
    (dict(cpus_per_node=0), "--cpus-per-node: must be >= 1, got 0"),
    (dict(gpus_per_node=-1), "--gpus-per-node: must be >= 0, got -1"),
    (dict(grace_s=0), "--grace: must be >= 1, got 0"),
    (dict(time="1h"), "--time '1h': not a SLURM time"),
    (dict(time="5", grace_s=300), "--grace 300: the sweep's stop signal must come before the time limit --time 5 (300 s)"),
    (dict(partition="gpu a100"), "--partition 'gpu a100': one word, no spaces"),
    (dict(account=""), "--account '': one word, no spaces"),
    (dict(sbatch=["#SBATCH"]), "--sbatch '#SBATCH': one sbatch option"),
    (dict(mtbert=" "), "--mtbert: give the command that runs it on the nodes"),
    (dict(sweep_name="a/b"), "--name 'a/b': a folder name under the job's runs/"),
    (dict(sweep_name="my sweep"), "--name 'my sweep': one word, no spaces"),
    (dict(workdir="/shared/my work"), "--workdir '/shared/my work': a folder without spaces"),
])
def test_a_bad_option_is_one_line(changes: dict, message: str) -> None:
    with pytest.raises(SweepError) as info:
        job_script(job(**changes))
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize("value, seconds", [("90", 5400), ("10:30", 630), ("1:00:00", 3600),
                                            ("2-12", 216000), ("1-00:30", 88200), ("0-00:00:45", 45)])
def test_slurm_time_formats(value: str, seconds: int) -> None:
    assert time_limit_s(value) == seconds


def test_the_cli_prints_the_script_and_refuses_a_bad_sweep(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from mtbert.cli import main

    assert main(["sweep", "slurm", str(ROOT / "sweeps" / "smoke.yaml"), "--smoke", "--nodes", "2",
                 "--sbatch", "mem=4G", "--workdir", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --nodes=2" in out and "#SBATCH --mem=4G" in out
    assert f"#SBATCH --chdir={tmp_path}" in out and " --smoke &" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "sweeps" / "smoke.yaml").read_text().replace("num_samples:", "num_sampels:"))
    assert main(["sweep", "slurm", str(bad), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert "#SBATCH" not in out and "num_sampels" in err and len(err.strip().splitlines()) == 1
