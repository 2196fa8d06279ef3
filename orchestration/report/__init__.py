"""Reporting on a sweep: read its runs back from MLflow and say what they show.

    leaderboard.py  the papers' table (md/csv/latex/html) and a Pareto plot: `mtbert leaderboard`
    export.py       the printed table formats shared by the leaderboard and importance
    importance.py   which swept keys matter per figure (fANOVA shares, a permutation test against seed noise)
    findings.py     the papers' claims checked against the runs: `mtbert findings`
    verdicts.py     the verdicts as a library on plain data (no MLflow, no Ray): intervals,
                    decide, diverged runs, a family's error rate, the adaptive seed rule
    best.py         the best configuration and its model's names: `mtbert best`

Reads sweep/ (claims, labels) and track/ (the best configuration); never the run loop.
"""
