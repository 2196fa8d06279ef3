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
    assert "sweep=${MTBERT_RESUME:-smoke-$SLURM_JOB_ID}" in script
    assert "<<" not in script and ">>" not in script


def test_defaults_name_no_path_of_this_machine() -> None:
    script = job_script(job())
    assert directives(script) == [
        "--job-name=mtbert-smoke", "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=2",
        "--chdir=/shared/work", "--output=slurm-%j.out", "--open-mode=append", "--requeue", "--signal=B:TERM@180"]
    assert "mtbert sweep run /shared/sweeps/smoke.yaml" in script and " ray start --head" in script
    assert str(ROOT) not in script and sys.executable not in script


def test_a_requeued_run_resumes_and_a_stopped_one_requeues() -> None:
    script = job_script(job())
    restart = script.index('if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || [ -n "${MTBERT_RESUME:-}" ]; then')
    assert restart < script.index(' sweep resume "$sweep"') < script.index("else", restart) \
        < script.index(" sweep run ")
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


# Stand-ins for the nodes' commands, for running the script itself on this machine: srun runs
# its command here (into its --output file; its other options dropped), `ray start` records the node it starts and blocks
# until signalled (the head's first start fails, as a head whose helpers imported too slowly
# does), `ray status` lists the nodes started, mtbert records its arguments.
STUBS = {
    "srun": """#!/bin/bash
while [ $# -gt 0 ]; do
  case "$1" in -w) node=$2; shift 2 ;; --output=*) out=${1#--output=}; shift ;; -*) shift ;; *) break ;; esac
done
out=${out//%j/$SLURM_JOB_ID}
exec "$@" >> "${out//%N/$node}" 2>&1
""",
    "scontrol": """#!/bin/bash
case "$1" in show) echo node1; echo node2 ;; requeue) echo "requeue $2" >> "$STUB_DIR/calls" ;; esac
""",
    "ray": """#!/bin/bash
case "$1" in
  start)
    if [ "$2" = --head ] && [ ! -e "$STUB_DIR/head-failed" ]; then
      touch "$STUB_DIR/head-failed"; echo "ray: head timed out" >&2; exit 1
    fi
    node=$([ "$2" = --head ] && echo head || echo worker)
    echo "start $node" >> "$STUB_DIR/calls"
    trap 'echo "stop $node" >> "$STUB_DIR/calls"; exit 0' TERM
    touch "$STUB_DIR/up-$node"; echo "Ray runtime started."; while true; do sleep 0.2; done ;;
  status) for f in "$STUB_DIR"/up-*; do [ -e "$f" ] && echo " 1 node_$(basename "$f")"; done ;;
esac
""",
    "mtbert": """#!/bin/bash
echo "mtbert $*" >> "$STUB_DIR/calls"
""",
}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_script_restarts_a_failed_head_then_starts_the_workers_and_stops_ray_at_the_end(tmp_path: Path) -> None:
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(job_script(job(nodes=2, workdir=str(tmp_path), ray_tmp=str(tmp_path))))
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "STUB_DIR": str(tmp_path),
           "SLURM_JOB_ID": "4321", "SLURM_CPUS_PER_TASK": "2", "SLURM_JOB_NODELIST": "node[1-2]",
           "MTBERT_HEAD_IP": "10.0.0.2"}
    env.pop("MTBERT_RESUME", None)
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "mtbert: Ray on node1 exited while starting (try 1 of 3" in out.stdout
    assert "mtbert: Ray at 10.0.0.2:23210, 2 of 2 node(s) joined: node1 node2" in out.stdout
    calls = (tmp_path / "calls").read_text().splitlines()
    # The worker starts after the head is up; the driver after both; Ray's nodes stop after it.
    assert calls[:2] == ["start head", "start worker"]
    assert calls[2] == ('mtbert sweep run /shared/sweeps/smoke.yaml --name=smoke-4321 --address=10.0.0.2:23210')
    assert sorted(calls[3:]) == ["stop head", "stop worker"]
    assert (tmp_path / "slurm-4321-ray-node1.out").read_text() == "ray: head timed out\nRay runtime started.\n"
    # The same job told to resume an earlier job's sweep (`sweep resume` of a job SLURM forgot).
    (tmp_path / "calls").unlink()
    for f in tmp_path.glob("up-*"):
        f.unlink()
    out = subprocess.run(["bash", str(script)], env={**env, "MTBERT_RESUME": "smoke-1234"}, capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "mtbert sweep resume smoke-1234 --address=10.0.0.2:23210" in (tmp_path / "calls").read_text()
