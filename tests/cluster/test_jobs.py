"""orchestration.run.jobs without a cluster: the command a job runs (executed by a real shell),
what it uploads, the CLI, and the one-line errors; plus docker/'s small scripts."""
from __future__ import annotations

import argparse
import http.server
import importlib.util
import json
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchestration.errors import SweepError
from orchestration.run import jobs
from tests.orchestration.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name.replace(".py", ""), DOCKER / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- entrypoint

def run_entrypoint(command: str, upload: Path, tmp_path: Path) -> dict:
    """Run a job's entrypoint with /bin/sh, as Ray does, with `python` replaced by a recorder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    recorder = bin_dir / "python"
    # The interpreter check (`python -c ...`) passes; the sweep's command is recorded.
    recorder.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                        "sys.argv[1] == '-c' and sys.exit(0)\n"
                        "print(json.dumps({'cwd': os.getcwd(), 'argv': sys.argv[1:]}))\n")
    recorder.chmod(recorder.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(["/bin/sh", "-c", command], cwd=upload, env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_entrypoint_runs_the_sweep_from_the_upload(tmp_path: Path) -> None:
    upload = tmp_path / "upload"
    upload.mkdir()
    command = jobs.entrypoint("sweeps/smoke.yaml", ["--smoke", "--set", "optim.lr=1e-3"], "http://mlflow:5000")
    seen = run_entrypoint(command, upload, tmp_path)
    assert seen == {"cwd": str(upload), "argv": ["-m", "mtbert.cli", "sweep", "run", "sweeps/smoke.yaml",
                                                 "--smoke", "--set", "optim.lr=1e-3",
                                                 "--tracking-uri", "http://mlflow:5000"]}


def test_entrypoint_with_workdir_runs_in_the_shared_folder(tmp_path: Path) -> None:
    upload, shared = tmp_path / "upload dir", tmp_path / "shared" / "work"
    upload.mkdir()
    command = jobs.entrypoint("sweeps/my sweep.yaml", ["--set", "base.note=a b;c"], None, str(shared))
    seen = run_entrypoint(command, upload, tmp_path)
    assert seen["cwd"] == str(shared)  # created, and the sweep runs there (runs/, caches)
    assert seen["argv"][4] == f"{upload}/sweeps/my sweep.yaml"  # still read from the upload
    assert seen["argv"][5:] == ["--set", "base.note=a b;c"]  # quoted, not split or run


def run_shell(command: str, cwd: Path, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"PATH": path} if path is not None else {})}
    return subprocess.run(["/bin/sh", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_entrypoint_takes_the_first_interpreter_found(tmp_path: Path) -> None:
    # A head started as .venv/bin/ray: its PATH has no `python` with Ray. The interpreter named
    # first (this one, where the head is local) runs the sweep; a missing one is passed over.
    command = jobs.entrypoint("sweeps/smoke.yaml", ["--help"], python=[str(tmp_path / "gone"), sys.executable])
    out = run_shell(command, ROOT, path="/usr/bin:/bin")
    assert out.returncode == 0 and "usage: mtbert sweep run" in out.stdout, out.stderr


def test_an_interpreter_without_the_project_is_one_line(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = str(bare / "bin" / "python")
    upload = tmp_path / "upload"
    upload.mkdir()  # without the project: mtbert is missing too
    out = run_shell(jobs.entrypoint("sweeps/smoke.yaml", python=python), upload)
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr == (f"mtbert: error: the job interpreter {python} on the head lacks ray, mlflow, torch, "
                          "mtbert; give `sweep submit --python` a Python of the head that has them "
                          "(docs/cluster.md)\n")
    out = run_shell(jobs.entrypoint("sweeps/smoke.yaml", python=["/no/such/python", "no-such-python"]), upload)
    assert out.returncode == 127
    assert out.stderr.startswith("mtbert: error: no interpreter /no/such/python, no-such-python on the head; ")
    # What `sweep status` and `submit` show of it: the one line.
    state = jobs.JobState("j", "FAILED", "Job entrypoint command failed with exit code 1, last available logs:\n"
                          + out.stderr, "")
    assert jobs._failure_line(state).startswith("no interpreter /no/such/python, no-such-python on the head; ")


def test_default_interpreter() -> None:
    # Ray tells no one which Python runs it on the head: where the dashboard is this machine,
    # this interpreter; the head's `python` after it (and alone for a remote head).
    assert jobs.default_python("http://127.0.0.1:8265") == [sys.executable, "python"]
    assert jobs.default_python("http://localhost:8265") == [sys.executable, "python"]
    assert jobs.default_python("http://head.example:8265") == ["python"]


def test_resume_entrypoint_runs_in_the_sweeps_workdir(tmp_path: Path) -> None:
    upload, shared = tmp_path / "upload", tmp_path / "shared"
    upload.mkdir()
    seen = run_entrypoint(jobs.resume_entrypoint("/shared/work/runs/s 1", workdir=str(shared)), upload, tmp_path)
    assert seen == {"cwd": str(shared), "argv": ["-m", "mtbert.cli", "sweep", "resume", "/shared/work/runs/s 1"]}


SWEEP_LOG = """\
2026-01-01 12:00:00,000\tINFO job_manager.py:581 -- Runtime env is setting up.
Running entrypoint for job mtbert-smoke-x: for PY in python; do ...
sweep smoke-20260101-120000: 4 trials (1 baseline), random search, asha scheduler | MLflow http://mlflow:5000 \
experiment 'smoke-smoke' (--smoke: apart from 'smoke') parent run 0123 | Ray storage /shared/work/runs/smoke-20260101-120000
[ 0:02] start   baseline-s0    I-I-I k=all lr=1.0e-03
[ 0:20] 1 running, 0 finished, 0 stopped early, 0 failed, 3 pending of 4 | best: none yet
[ 0:41] 2 running, 1 finished, 0 stopped early, 0 failed, 1 pending of 4, about 00:35 left | best best_overall 0.4100 (baseline-s0: I-I-I k=all lr=1.0e-03)
(pid=123) some trial output
"""


def test_progress_is_read_from_the_drivers_log() -> None:
    found = jobs.sweep_progress(SWEEP_LOG)
    assert found.name == "smoke-20260101-120000"
    assert found.run_dir == "/shared/work/runs/smoke-20260101-120000"
    # The time left travels with the counts: `sweep status` shows it too.
    assert (found.clock, found.counts) == ("0:41", "2 running, 1 finished, 0 stopped early, 0 failed, 1 pending "
                                                   "of 4, about 00:35 left | best best_overall 0.4100 (baseline-s0: I-I-I k=all lr=1.0e-03)")
    assert found.ended is None
    adaptive = jobs.sweep_progress(SWEEP_LOG + "[ 1:00] 1 running, 2 finished, 0 stopped early, 0 failed, 1 pending in "
                                   "round 1 (up to 8 trials in all), about 00:20 left in this round | best: none yet\n")
    assert adaptive.counts.startswith("1 running, 2 finished") and "left in this round" in adaptive.counts
    ended = jobs.sweep_progress(SWEEP_LOG + "sweep smoke-20260101-120000 FINISHED in 1m02s: 4 trials, 4 finished "
                                "(0 stopped early), 0 failed; best overall 0.4200 (p001-s0)\n")
    assert ended.ended == "FINISHED: 4 trials, 4 finished (0 stopped early), 0 failed; best overall 0.4200 (p001-s0)"
    resumed = jobs.sweep_progress("resuming sweep s1 | MLflow sqlite:///m.db parent run 0123\n")
    assert (resumed.name, resumed.run_dir) == ("s1", None)


# --------------------------------------------------------------------------- runtime_env

def test_runtime_env_uploads_the_project_without_local_state() -> None:
    env = jobs.runtime_env(ROOT)
    assert env["working_dir"] == str(ROOT)
    assert "py_modules" not in env  # mtbert/ and orchestration/ travel inside the working dir
    for heavy in (".venv/", ".git/", "runs/", ".mtbert_cache/", "mlflow.db"):
        assert heavy in env["excludes"]


def test_runtime_env_ships_packages_that_live_outside_the_working_dir(tmp_path: Path) -> None:
    env = jobs.runtime_env(tmp_path)
    assert env["working_dir"] == str(tmp_path)
    assert sorted(env["py_modules"]) == [str(ROOT / "mtbert"), str(ROOT / "orchestration")]


# --------------------------------------------------------------------------- errors

def test_errors_before_anything_is_uploaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(jobs.JobError, match="sweep file not found"):
        jobs.submit("sweeps/nope.yaml", dead)
    outside = tmp_path / "mine.yaml"
    outside.write_text((ROOT / "sweeps" / "smoke.yaml").read_text())
    with pytest.raises(jobs.JobError, match="outside .*the folder the job uploads"):
        jobs.submit(outside, dead)
    # Broken YAML fails here, in one line naming the file and line, before any upload.
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nspace: [\n")
    with pytest.raises(SweepError, match=r"broken\.yaml: line \d+ not valid YAML") as info:
        jobs.submit(broken, dead, working_dir=tmp_path)
    assert not isinstance(info.value, jobs.ClusterUnreachable) and "\n" not in str(info.value)


def test_a_failed_job_is_one_line_with_the_sweeps_own_error() -> None:
    log_tail = ("Job entrypoint command failed with exit code 2, last available logs:\n"
                "some output\nmtbert: error: sweeps/smoke.yaml: num_sample: unknown key\n")
    assert jobs._failure_line(jobs.JobState("j", "FAILED", log_tail, "")) == \
        "sweeps/smoke.yaml: num_sample: unknown key"
    assert jobs._failure_line(jobs.JobState("j", "STOPPED", "Job was intentionally stopped.\n", "")) == \
        "Job was intentionally stopped."


def test_unreachable_dashboard_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    dead = f"http://127.0.0.1:{free_port()}"
    for call in (lambda: jobs.submit("sweeps/smoke.yaml", dead, ["--smoke"], follow=False),
                 lambda: jobs.status("mtbert-x", dead), lambda: jobs.stop("mtbert-x", dead)):
        with pytest.raises(jobs.ClusterUnreachable, match=f"no Ray dashboard at {dead}") as info:
            call()
        assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_address_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(jobs.ADDRESS_ENV, raising=False)
    with pytest.raises(jobs.JobError, match="--address: give the Ray dashboard address"):
        jobs.status("x", None)
    with pytest.raises(jobs.JobError, match="Ray Client address"):
        jobs.status("x", "ray://head:10001")


# --------------------------------------------------------------------------- CLI

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mtbert")
    sweep = p.add_subparsers(dest="command").add_parser("sweep")
    jobs.add_job_commands(sweep.add_subparsers(dest="sweep_command"))
    return p


def test_cli_commands_parse() -> None:
    args = parser().parse_args(["sweep", "submit", "sweeps/smoke.yaml", "--address", "http://h:8265",
                                "--no-follow", "--set", "a=1", "--set", "b=2", "--smoke",
                                "--tracking-uri", "http://mlflow:5000", "--workdir", "/shared/work",
                                "--python", "/opt/venv/bin/python"])
    assert (args.file, args.address, args.no_follow, args.set, args.smoke, args.tracking_uri, args.workdir,
            args.python) == ("sweeps/smoke.yaml", "http://h:8265", True, ["a=1", "b=2"], True,
                             "http://mlflow:5000", "/shared/work", "/opt/venv/bin/python")
    assert args.func is jobs._cmd_submit
    for command in ("status", "stop"):
        args = parser().parse_args(["sweep", command, "mtbert-smoke-1", "--address", "http://h:8265"])
        assert (args.job_id, args.address) == ("mtbert-smoke-1", "http://h:8265")


def test_cli_handlers_raise_one_line_value_errors() -> None:
    # mtbert's main prints any ValueError as one `mtbert: error: ...` line, exit 2.
    args = parser().parse_args(["sweep", "status", "mtbert-x", "--address", f"127.0.0.1:{free_port()}"])
    with pytest.raises(ValueError, match=r"^no Ray dashboard at http://127\.0\.0\.1:\d+; ") as info:
        args.func(args)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- docker/ scripts

class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/ok" else 503)
        self.end_headers()
        self.wfile.write(b"success")

    def log_message(self, *args) -> None:
        pass


def test_healthcheck_script() -> None:
    check = load_script("healthcheck.py")
    server = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        assert check.main([f"{base}/ok", f"{base}/ok"]) == 0
        assert check.main([f"{base}/ok", f"{base}/sick"]) == 1
        assert check.main([f"http://127.0.0.1:{free_port()}/ok"]) == 1
        assert check.main([]) == 2
    finally:
        server.shutdown()


def test_gen_env_fills_every_blank_with_a_fresh_secret() -> None:
    gen = load_script("gen_env.py")
    example = (DOCKER / ".env.example").read_text()
    first, second = gen.fill(example), gen.fill(example)
    values = dict(line.split("=", 1) for line in first.splitlines() if re.match(r"^[A-Z]", line))
    blanks = [line[:-1] for line in example.splitlines() if re.fullmatch(r"[A-Z][A-Z0-9_]*=", line)]
    assert blanks and all(re.fullmatch(r"[0-9a-f]{48}", values[key]) for key in blanks)
    assert first != second  # fresh every time
    assert values["MLFLOW_ADMIN_USERNAME"] == "admin"  # set values are kept
    out = subprocess.run([sys.executable, str(DOCKER / "gen_env.py"), "--print"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and "RAY_AUTH_TOKEN=" in out.stdout


def test_a_head_whose_job_agent_is_not_up_yet_is_waited_for(monkeypatch):
    """Right after `ray start` the dashboard answers 500 "No available agent to submit job":
    the submit waits for the agent instead of failing; any other refusal is one line at once."""
    from orchestration.run import jobs

    class Head:
        calls = 0

        def submit_job(self, **job):
            Head.calls += 1
            if Head.calls < 3:
                raise RuntimeError("Request failed with status code 500: No available agent to submit job, "
                                   "please try again later.")

    monkeypatch.setattr(jobs.time, "sleep", lambda s: None)
    jobs._submit(Head(), "http://head:8265", entrypoint="true")
    assert Head.calls == 3

    class Refusing:
        def submit_job(self, **job):
            raise RuntimeError("Request failed with status code 400: bad runtime_env")

    with pytest.raises(jobs.JobError, match="^Ray cluster at http://head:8265: .*bad runtime_env"):
        jobs._submit(Refusing(), "http://head:8265", entrypoint="true")
