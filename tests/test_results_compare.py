"""docs/results/compare.py: the check that a re-run reproduces a committed leaderboard."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = ("| Regime | LR | w [sst para sts] | Overall | SC acc. | Train time (s) | n |\n"
          "| --- | --- | --- | ---: | ---: | ---: | ---: |\n")


def table(path: Path, rows: dict[str, tuple[str, str]]) -> Path:
    path.write_text(HEADER + "".join(f"| {regime} | 2.0e-04 | equal | {overall} | {sst} | 100.0 ± 5.0 | 2 |\n"
                                     for regime, (overall, sst) in rows.items()) + "\n* baseline\n")
    return path


def compare(tmp_path, committed: dict, rerun: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "docs" / "results" / "compare.py"),
                           str(table(tmp_path / "a.md", committed)), str(table(tmp_path / "b.md", rerun))],
                          capture_output=True, text=True)


COMMITTED = {"I-I-I k=all*": ("0.500 ± 0.050", "0.350 ± 0.010"), "I-I-I k=0": ("0.400 ± 0.030", "0.340 ± 0.020")}


def test_identical_and_shifted_within_noise_pass(tmp_path):
    assert compare(tmp_path, COMMITTED, COMMITTED).returncode == 0
    shifted = {**COMMITTED, "I-I-I k=0": ("0.450 ± 0.040", "0.330 ± 0.020")}
    proc = compare(tmp_path, COMMITTED, shifted)
    assert proc.returncode == 0 and "within seed noise" in proc.stdout, proc.stdout


def test_a_score_outside_the_band_or_a_missing_trial_fails(tmp_path):
    far = {**COMMITTED, "I-I-I k=0": ("0.600 ± 0.030", "0.340 ± 0.020")}
    proc = compare(tmp_path, COMMITTED, far)
    assert proc.returncode == 1 and "Overall 0.400 -> 0.600 (OUTSIDE)" in proc.stdout, proc.stdout
    proc = compare(tmp_path, COMMITTED, {"I-I-I k=all*": COMMITTED["I-I-I k=all*"]})
    assert proc.returncode == 1 and "only in the committed table: I-I-I k=0" in proc.stdout, proc.stdout


def test_tables_printing_confidence_intervals_are_read_back_to_seed_std(tmp_path):
    # 0.635 is the 95% half-width of two seeds with std 0.0707 (t = 12.706): the band is the std's
    ci = {"I-I-I k=all*": ("0.500 ± 0.635", "0.350 ± 0.010"), "I-I-I k=0": ("0.400 ± 0.635", "0.340 ± 0.020")}
    moved = {**ci, "I-I-I k=0": ("0.600 ± 0.635", "0.340 ± 0.020")}
    for name, rows in (("a.md", ci), ("b.md", moved)):
        table(tmp_path / name, rows)
        path = tmp_path / name
        path.write_text(path.read_text() + "seeds grouped as mean ± the half-width of the 95% confidence interval\n")
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "results" / "compare.py"),
                           str(tmp_path / "a.md"), str(tmp_path / "b.md")], capture_output=True, text=True)
    assert "Overall ±0.141" in proc.stdout, proc.stdout  # 2 x 0.0707 x sqrt(2 / 2)
    assert proc.returncode == 1 and "OUTSIDE" in proc.stdout


def test_a_bold_best_value_is_read_as_its_number(tmp_path):
    # The leaderboard bolds each column's best: **0.500** ± 0.050 is 0.500 ± 0.050.
    bold = {"I-I-I k=all*": ("**0.500** ± 0.050", "0.350 ± 0.010"), "I-I-I k=0": ("0.400 ± 0.030", "**0.340** ± 0.020")}
    assert compare(tmp_path, COMMITTED, bold).returncode == 0
    far = {**bold, "I-I-I k=0": ("**0.600** ± 0.030", "0.340 ± 0.020")}
    proc = compare(tmp_path, COMMITTED, far)
    assert proc.returncode == 1 and "Overall 0.400 -> 0.600 (OUTSIDE)" in proc.stdout, proc.stdout
