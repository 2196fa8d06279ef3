"""Reporting on a sweep: read its runs back from MLflow and say what they show.

    leaderboard.py  `mtbert leaderboard`: the table, its Pareto plot and the stored importance, in one call
    reader.py       a sweep's runs and artifacts in MLflow (SQL for a sqlite store, else MLflow's client)
    table.py        the papers' table: a row per configuration, its cells, columns and caption
    plots.py        the Pareto plot and the importance bar chart
    export.py       the formats (FORMATS: md, csv, latex, html), shared by every table
    importance.py   which swept keys matter per figure (fANOVA shares, a permutation test against seed noise)
    findings.py     the papers' claims checked against the runs: `mtbert findings`
    verdicts.py     the verdicts as a library on plain data (no MLflow, no Ray): intervals,
                    decide, diverged runs, a family's error rate, the adaptive seed rule
    best.py         the best configuration and its model's names: `mtbert best`
    affinity.py     the inter-task affinities the trials measured (a leaderboard section) and
                    `mtbert affinity`: a suggested grouping of the tasks and its sweep

Reads sweep/ (claims, labels) and track/ (the best configuration); never the run loop. Within
report/, imports point one way and name no private (_) name of another module: reader, export
and verdicts import none of report/; table reads those three, plots reads table, importance
reads all of these, leaderboard importance and affinity too; findings reads reader, export and
verdicts, best reads reader, affinity reader and export.
"""
