"""docs/results/rederive_findings.py: the first study's verdicts read back from its printed intervals."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDY = sorted(str(p) for p in (ROOT / "sweeps" / "study").glob("*.yaml"))


def rederive(path: Path) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "results" / "rederive_findings.py"), str(path),
                           *STUDY], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return path.read_text()


def test_the_committed_table_is_what_the_script_gives(tmp_path):
    committed = ROOT / "docs" / "results" / "study" / "first_study_findings.md"
    copy = tmp_path / "findings.md"
    shutil.copy(committed, copy)
    text = rederive(copy)
    assert text == committed.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "(n=" in line]
    assert len(rows) == 8
    decided = [row.split(" | ")[0][2:] for row in rows if "**inconclusive**" not in row]
    assert decided == ["loss weights [sst .2 para .4 sts .4] below equal (frozen I-S-S)"], decided
    assert "**no difference that matters**: \\|A − B\\| < 0.01" in text


def test_a_bound_printed_at_the_smallest_effect_says_the_rounding_could_change_it(tmp_path):
    # low printed -0.010 with mean - half = -0.010: the unrounded low lies either side of -δ
    table = tmp_path / "findings.md"
    table.write_text("| freezing the bottom half lifts STS | x | sts_corr | A > B | "
                     "-0.003 ± 0.007 [-0.010, +0.004] (n=3) | **inconclusive** | x |\n")
    row = next(line for line in rederive(table).splitlines() if line.startswith("| freezing"))
    assert "within the printed rounding also" in row, row
