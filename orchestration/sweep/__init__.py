"""Defining a sweep: a sweep YAML -> a validated Sweep -> the trials to run, before any compute.

    spec.py     the sweep file -> a validated `Sweep` (every value the space can produce is
                checked against the config now, not in trial 7)
    space.py    one class per `space:` dimension type (grid, choice, uniform, loguniform, ...)
    plan.py     Sweep -> self-contained trial configs (grid/random expanded in the driver, seeds)
    claims.py   `claims:` what the sweep sets out to show, and which configurations decide it
    labels.py   short human labels for a configuration (regime, lr, weights), shared by the
                progress lines and the leaderboard

Nothing here imports from the other rooms: a sweep is defined without Ray running or MLflow.
"""
