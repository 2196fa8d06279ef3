"""`mtbert sweep status JOB` and `mtbert sweep resume JOB` for SLURM jobs, from the login node,
against stand-ins for scontrol, sacct and sbatch (small scripts on PATH that answer from files
and record what they were asked): a job id or a sweep's name finds the job, its folder and its
sweep; a job SLURM holds is requeued, one it forgot is submitted again from its saved script,
told which sweep to resume; an unknown id, a running job or a finished sweep is one line.
tests/cluster/test_slurm_two_nodes.py runs status and resume on a real SLURM."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from mtbert.cli import main

SCONTROL = """#!/bin/sh
# scontrol show job -o ID: the file jobs/ID, else SLURM's own error; scontrol requeue ID: noted.
case "$1" in
  show) if [ -f "$FAKE_SLURM/jobs/$4" ]; then cat "$FAKE_SLURM/jobs/$4"; else
          echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; fi ;;
  requeue) echo "$2" >> "$FAKE_SLURM/requeued" ;;
esac
"""
SACCT = """#!/bin/sh
echo "sacct: error: Slurm accounting storage is disabled" >&2
exit 1
"""
SBATCH = """#!/bin/sh
# The script on stdin and the options are kept; the new job is 777.
cat > "$FAKE_SLURM/submitted.sh"
echo "$@" > "$FAKE_SLURM/sbatch_args"
echo 777
"""
LOG_RUNNING = """mtbert: run 1 of job 4242 on node1 node2, 2026-11-27T22:00:00Z
mtbert: Ray at 10.0.0.2:20010, 2 of 2 node(s) joined: node1 node2
sweep smoke-4242: 2 trials (1 baseline), random search, asha scheduler | MLflow sqlite:///w/mlflow.db \
experiment 'smoke-smoke' parent run abc | Ray storage {run_dir}
[ 0:40] 2 running, 0 finished, 0 stopped early, 0 failed, 0 pending of 2 | best: none yet
"""
LOG_KILLED = LOG_RUNNING + "sweep smoke-4242 KILLED in 1m02s: 2 trials, 0 finished (0 stopped early), 0 failed\n"
LOG_FINISHED = LOG_RUNNING + "sweep smoke-4242 FINISHED in 1m30s: 2 trials, 2 finished (0 stopped early), 0 failed\n"


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A login node's SLURM clients; a job folder `work` with job 4242 of `sweep slurm`."""
    fake = tmp_path / "fake"
    (fake / "bin").mkdir(parents=True)
    (fake / "jobs").mkdir()
    for name, text in (("scontrol", SCONTROL), ("sacct", SACCT), ("sbatch", SBATCH)):
        path = fake / "bin" / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(fake))
    for key in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    work = tmp_path / "work"
    (work / "runs" / "smoke-4242").mkdir(parents=True)
    (work / "runs" / "smoke-4242" / "tuner.pkl").write_bytes(b"state")
    (work / "slurm-4242.json").write_text(json.dumps({"job_id": "4242", "sweep": "smoke-4242",
                                                      "script": "#!/bin/bash\n#SBATCH --nodes=2\necho job\n"}))
    monkeypatch.chdir(tmp_path)  # the login node's folder is not the job's: SLURM says where that is
    return fake


def held(fake: Path, state: str, work: Path, log: str | None) -> None:
    """SLURM holds job 4242 in `state`; its log says `log`."""
    (fake / "jobs" / "4242").write_text(
        f"JobId=4242 JobName=mtbert-smoke JobState={state} Reason=None Restarts=0 RunTime=00:01:10 "
        f"NodeList=node[1-2] WorkDir={work} StdOut={work}/slurm-4242.out\n")
    if log is not None:
        (work / "slurm-4242.out").write_text(log.format(run_dir=work / "runs" / "smoke-4242"))


def cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    rc = main(["sweep", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_status_by_job_id_and_by_sweep_name(slurm: Path, tmp_path: Path, capsys) -> None:
    work = tmp_path / "work"
    held(slurm, "RUNNING", work, LOG_RUNNING)
    rc, out, _ = cli(capsys, "status", "4242")
    assert rc == 0
    assert out.splitlines()[:4] == [
        "SLURM job 4242: RUNNING, nodes node[1-2], run time 00:01:10",
        f"  sweep smoke-4242 (Ray storage {work / 'runs' / 'smoke-4242'})",
        "  trials at 0:40: 2 running, 0 finished, 0 stopped early, 0 failed, 0 pending of 2 | best: none yet",
        f"  log: {work / 'slurm-4242.out'}"]
    # By the sweep's name, in the job's folder (the record names the sweep's job).
    rc, by_name, _ = cli(capsys, "status", "smoke-4242", "--workdir", str(work))
    assert rc == 0 and by_name == out


def test_status_of_a_job_slurm_forgot_reads_its_folder(slurm: Path, tmp_path: Path, capsys) -> None:
    work = tmp_path / "work"
    held(slurm, "COMPLETED", work, LOG_FINISHED)
    (slurm / "jobs" / "4242").unlink()  # after MinJobAge, and no accounting: only the folder knows
    rc, out, _ = cli(capsys, "status", "4242", "--workdir", str(work))
    assert rc == 0
    assert out.startswith("SLURM job 4242: not held by SLURM any more (ended)\n  sweep smoke-4242")
    assert "  ended FINISHED: 2 trials, 2 finished" in out


def test_a_requeued_jobs_status_is_its_latest_runs(slurm: Path, tmp_path: Path, capsys) -> None:
    """A requeued job appends to its log: the counts and the end are the latest run's."""
    work = tmp_path / "work"
    held(slurm, "RUNNING", work, LOG_KILLED + "mtbert: run 2 of job 4242 on node1 node2, 2026-11-27T22:05:00Z\n")
    rc, out, _ = cli(capsys, "status", "4242")
    assert rc == 0 and "  sweep smoke-4242 (Ray storage" in out
    assert "  trials: no count yet" in out and "ended" not in out


@pytest.mark.parametrize("ref", ["987654", "no-such-sweep"])
def test_an_unknown_job_or_sweep_is_one_line(slurm: Path, capsys, ref: str) -> None:
    rc, out, err = cli(capsys, "status", ref)
    assert rc == 2 and not out and len(err.strip().splitlines()) == 1
    assert (f"{ref}: no SLURM job of that id" if ref.isdigit() else f"{ref}: not a SLURM job's id") in err
    rc, out, err = cli(capsys, "resume", "987654")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "987654: no SLURM job of that id" in err


def test_a_held_job_is_requeued_to_resume_its_sweep(slurm: Path, tmp_path: Path, capsys) -> None:
    work = tmp_path / "work"
    held(slurm, "COMPLETED", work, LOG_KILLED)  # stopped for good with --signal=INT
    rc, out, _ = cli(capsys, "resume", "4242")
    assert rc == 0 and out.startswith("requeued SLURM job 4242: its next run resumes sweep smoke-4242\n")
    assert (slurm / "requeued").read_text() == "4242\n" and not (slurm / "submitted.sh").exists()


def test_a_forgotten_job_is_submitted_again_to_resume_its_sweep(slurm: Path, tmp_path: Path, capsys) -> None:
    work = tmp_path / "work"
    held(slurm, "TIMEOUT", work, LOG_KILLED)
    (slurm / "jobs" / "4242").unlink()
    rc, out, _ = cli(capsys, "resume", "smoke-4242", "--workdir", str(work))
    assert rc == 0
    assert out.startswith("submitted SLURM job 777: it resumes sweep smoke-4242 of job 4242")
    # The saved script, told which sweep to resume (the script's sweep= line reads MTBERT_RESUME).
    assert (slurm / "submitted.sh").read_text() == "#!/bin/bash\n#SBATCH --nodes=2\necho job\n"
    assert (slurm / "sbatch_args").read_text().split() == ["--parsable", "--export=ALL,MTBERT_RESUME=smoke-4242"]
    record = json.loads((work / "slurm-777.json").read_text())
    assert record["sweep"] == "smoke-4242" and record["resumes"] == "4242"
    # The sweep's name now finds the new job; the old job says who resumed it, and is not resumed twice.
    rc, out, _ = cli(capsys, "status", "4242", "--workdir", str(work))
    assert "  resumed by SLURM job 777" in out
    rc, out, err = cli(capsys, "resume", "4242", "--workdir", str(work))
    assert rc == 2 and "was resumed by job 777" in err


@pytest.mark.parametrize("state, log, message", [
    ("RUNNING", LOG_RUNNING, "SLURM job 4242 is RUNNING: a sweep has one driver at a time; "
                             "`scancel --signal=INT --batch 4242` stops it cleanly first"),
    ("PENDING", None, "SLURM job 4242 is PENDING: a sweep has one driver at a time"),
    ("COMPLETED", LOG_FINISHED, "sweep smoke-4242 (SLURM job 4242) FINISHED: nothing to resume"),
])
def test_a_job_that_cannot_resume_is_one_line(slurm: Path, tmp_path: Path, capsys, state, log, message) -> None:
    held(slurm, state, tmp_path / "work", log)
    rc, out, err = cli(capsys, "resume", "4242")
    assert rc == 2 and not out and len(err.strip().splitlines()) == 1 and message in err
    assert not (slurm / "requeued").exists()


def test_a_name_no_slurm_job_ran_resumes_as_before(slurm: Path, tmp_path: Path, capsys) -> None:
    """A sweep folder of this machine (no SLURM record names it) is resumed here, as always."""
    rc, out, err = cli(capsys, "resume", "other-sweep", "--storage", str(tmp_path / "work" / "runs"))
    assert rc == 2 and "other-sweep: not a sweep folder" in err
    rc, out, err = cli(capsys, "resume", "other-sweep")
    assert rc == 2 and "other-sweep: not a sweep folder" in err
