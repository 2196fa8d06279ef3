"""Defining a sweep: a sweep YAML -> a validated Sweep -> the trials to run, before any compute.

    load.py     the sweep file -> a validated `Sweep` (every value the space can produce is
                checked against the config now, not in trial 7; claims against the plan)
    spec.py     the schema of a sweep file, the `Sweep` it loads into, and the small parsers
                (seeds:, verdicts:, --set) that claims.py shares
    bounds.py   the most a sweep file may ask for (dimensions, configurations, seeds, trials)
    space.py    one class per `space:` dimension type (grid, choice, uniform, loguniform, ...)
    plan.py     Sweep -> self-contained trial configs (grid/random expanded in the driver, seeds)
    claims.py   `claims:` what the sweep sets out to show, and which configurations decide it
    labels.py   short human labels for a configuration (regime, lr, weights), shared by the
                progress lines and the leaderboard

Nothing here imports from the other rooms: a sweep is defined without Ray running or MLflow.
Inside, imports point one way: load -> plan, claims -> spec -> space -> bounds (and labels).
"""
