"""Sweeps of mtbert's train() on Ray Tune, tracked in MLflow, in four rooms by what they do:

    sweep/    defining a sweep: the YAML, its search space, the planned trials, its claims
    run/      running it: launch and resume, the Tune trainable, searcher, scheduler and
              callbacks, checks on every node, Ray Jobs on a cluster
    track/    tracking it: MLflow parent/child runs, the write queue, the TM-relative score,
              logged models
    report/   reporting on it: the leaderboard, importance, findings and verdicts, `mtbert best`

Beside them, the pieces every room uses: errors.py (one-line user errors), paths.py (absolute
paths and tracking URIs before launch), stats.py (seed statistics), and cli.py (the commands
registered into mtbert's CLI). Imports point one way: sweep <- track <- report <- run <- cli
(tests/test_layout.py checks it).
"""
