"""Re-derive a findings table's verdicts from the intervals it prints, without the runs.

    python docs/results/rederive_findings.py docs/results/study/first_study_findings.md sweeps/study/*.yaml

Reads each row's claim and its `mean ± half [low, high] (n=N)` (fixed design, 3 decimals),
decides the claims the sweep files declare (matched by name, in the table's order) with
orchestration/report/verdicts.py, and rewrites the file under a heading that says so. Each printed
figure is rounded, so the unrounded bounds lie within 0.0005 of the printed ones and within
0.001 of mean ∓ half: the verdict is read at the middle of what both allow, and a claim whose
verdict would change somewhere within them says so.
"""
from __future__ import annotations

import dataclasses
import math
import re
import sys
from pathlib import Path

from orchestration.report.findings import claim_row, render, table_of
from orchestration.report.verdicts import Verdict, decide_from_summary
from orchestration.sweep.claims import read_claims

ROUNDING = 0.0005  # half the last printed digit
NUMBER = r"[-+]?\d+\.\d+"
ROW = re.compile(rf"^\| (?P<claim>.+?) \|.*?\| (?P<mean>{NUMBER}) ± (?P<half>{NUMBER}) "
                 rf"\[(?P<low>{NUMBER}), (?P<high>{NUMBER})\] \(n=(?P<n>\d+)")
HEADING = """# The first study's findings, re-derived from the printed intervals

The first study (125 trials, fixed seeds, fp32), before adaptive seeds and probed heads; the
study as it stands is [README.md](README.md) and [findings.md](findings.md). Re-derived from its
intervals as `mtbert findings` printed them (3 decimals, fixed design), not from its runs: the
spread is read back from each half-width (s = h √n / t(0.975, n−1)) and the verdicts of
orchestration/report/verdicts.py applied with δ = 0.01 and the papers' own effects, by

    python docs/results/rederive_findings.py docs/results/study/first_study_findings.md sweeps/study/*.yaml

"""


def bounds(mean: float, half: float, low: float, high: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """The ranges of the unrounded low and high that every printed figure allows."""
    def allowed(printed: float, derived: float) -> tuple[float, float]:
        # open at both ends, so that a bound printed exactly at ±δ is not read as past it
        return (max(printed - ROUNDING, derived - 2 * ROUNDING) + 1e-9,
                min(printed + ROUNDING, derived + 2 * ROUNDING) - 1e-9)
    return allowed(low, mean - half), allowed(high, mean + half)


def rederive(printed: dict[str, str], claim) -> Verdict:
    mean, half, low, high = (float(printed[k]) for k in ("mean", "half", "low", "high"))
    n = int(printed["n"])
    (low_min, low_max), (high_min, high_max) = bounds(mean, half, low, high)
    low, high = (low_min + low_max) / 2, (high_min + high_max) / 2
    verdict = decide_from_summary((low + high) / 2, (high - low) / 2, n, claim)
    others = {decide_from_summary((lo + hi) / 2, (hi - lo) / 2, n, claim).outcome for lo in (low_min, low_max) for hi in (high_min, high_max)} - {verdict.outcome}
    if others:
        verdict = dataclasses.replace(verdict, detail=f"{verdict.detail}; within the printed rounding also "
                                                      + " or ".join(sorted(others)))
    return verdict


def main(path: str, sweep_files: list[str]) -> None:
    file = Path(path)
    printed = {m["claim"]: m.groupdict() for m in map(ROW.match, file.read_text().splitlines()) if m}
    order = list(printed)
    # The printed intervals are fixed-design ones (`(n=N)`, no looks): read them as such even
    # where the sweep files have since declared adaptive seeds.
    # Each a t-interval of the mean at 95% on its own (per claim), as they were printed.
    claims = sorted((dataclasses.replace(c, looks=None, error_rate="claim", interval="mean")
                     for f in sweep_files for c in read_claims(f)),
                    key=lambda c: order.index(c.name) if c.name in order else len(order))
    rows = []
    for claim in claims:
        found = printed.get(claim.name)
        verdict = rederive(found, claim) if found else decide_from_summary(math.nan, math.nan, 0, claim)
        rows.append(claim_row(claim, verdict, verdict.interval.n, verdict.interval.n))
    file.write_text(HEADING + render(table_of(rows)))
    print(file.read_text())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
