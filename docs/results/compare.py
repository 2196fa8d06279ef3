"""Check a re-run against a committed leaderboard: same trial set, scores within seed noise.

    python docs/results/compare.py docs/results/study/encoder_sharing.md runs/rerun.md

Both files are `mtbert leaderboard --format md` tables. Rows are matched by configuration
(regime, learning rate, loss weights), and each score column's means are compared. Seed
noise is pooled over every row of both tables (one configuration's two seeds say little
about its own spread): a difference of means counts as noise within two standard errors,
2 x s x sqrt(2 / n), s the pooled seed std and n the seeds per row. Single-seed tables
must match exactly. Tables whose caption says "95% confidence interval" print mean ± the
interval's half-width (the leaderboard since the paired-Δ column): the seed std is read back
from it (s = h √n / t(0.975, n−1)). Time, size and memory columns are printed, not judged: they depend on
the machine and what else ran on it. Exit status 1 when the trial sets differ or a score
falls outside its band.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

SCORES = ("Overall", "SC acc.", "PD acc.", "STS corr.")
MACHINE = ("Train time (s)", "TM-rel.", "Peak mem. (MB)")


CI_CAPTION = "95% confidence interval"


def read_table(path: Path) -> dict[tuple[str, ...], dict[str, str]]:
    text = path.read_text()
    lines = [line for line in text.splitlines() if line.startswith("|")]
    if len(lines) < 3:
        raise SystemExit(f"{path}: no Markdown table")

    def cells(line: str) -> list[str]:
        # A column's best value is bold (**0.512** ± 0.013): the number is what is compared.
        return [c.strip().replace("**", "") for c in line.strip().strip("|").split(" | ")]
    header = cells(lines[0])
    rows = {}
    for line in lines[2:]:
        row = dict(zip(header, cells(line)))
        weights = next((row[h] for h in header if h.startswith("w [")), "")
        # `LR`, or `LR (enc. / heads)` since tables name both rates: the encoder's rate keys the
        # row, so a re-run matches a table committed before (a head-only row's `–` does not).
        lr = next((row[h] for h in header if h.startswith("LR")), "").split(" / ")[0]
        if CI_CAPTION in text:
            row["_ci"] = "1"
        rows[(row["Regime"], lr, weights)] = row
    return rows


def parse(cell: str) -> tuple[float, float]:
    mean, _, std = cell.partition(" ± ")
    return float(mean), float(std) if std else 0.0


def seed_std(row: dict[str, str], col: str) -> float:
    """The seed std of a cell: printed as such, or read back from a 95% CI half-width."""
    spread = parse(row[col])[1]
    n = int(row.get("n", "1"))
    if not row.get("_ci") or n < 2:
        return spread
    from scipy.stats import t

    return spread * math.sqrt(n) / float(t.ppf(0.975, n - 1))


def band(col: str, *tables: dict) -> float:
    """Two standard errors of a difference of two n-seed means, from the pooled seed std."""
    rows = [row for table in tables for row in table.values() if col in row]
    if not rows:
        return 0.0
    variances = [seed_std(row, col) ** 2 for row in rows]
    n = min(int(row.get("n", "1")) for row in rows)
    return 2 * math.sqrt(sum(variances) / len(variances)) * math.sqrt(2 / n) if n > 1 else 0.0


def main(committed: str, rerun: str) -> int:
    a, b = read_table(Path(committed)), read_table(Path(rerun))
    ok = True
    for key in sorted(a.keys() ^ b.keys()):
        print(f"only in {'the committed table' if key in a else 'the re-run'}: {' '.join(key)}")
        ok = False
    bands = {col: band(col, a, b) for col in SCORES if any(col in row for row in [*a.values(), *b.values()])}
    print("noise bands (2 standard errors of a difference): "
          + ", ".join(f"{col} ±{width:.3f}" for col, width in bands.items()))
    for key in sorted(a.keys() & b.keys()):
        parts = []
        for col in bands:
            if col not in a[key] or col not in b[key]:
                continue
            ma, mb = parse(a[key][col])[0], parse(b[key][col])[0]
            noise = abs(ma - mb) <= bands[col] + 5e-4  # the tables print 3 decimals
            ok &= noise
            parts.append(f"{col} {ma:.3f} -> {mb:.3f}" + ("" if noise else " (OUTSIDE)"))
        machine = [f"{col} {a[key][col]} -> {b[key][col]}" for col in MACHINE if col in a[key] and col in b[key]]
        print(f"{' '.join(key)}: {'; '.join(parts)} | {'; '.join(machine)}")
    print("same trial set, scores within seed noise" if ok else "DIFFERENT: see the lines above")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
