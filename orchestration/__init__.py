"""Sweeps of mtbert's train() on Ray Tune, tracked in MLflow.

    spec.py        sweep YAML -> validated Sweep (space.py: one class per dimension type)
    plan.py        Sweep -> self-contained trial configs (grid/random expanded in the driver)
    searcher.py    baselines first, then the plan or Optuna; seeds; checkpointable
    scheduler.py   FIFO or ASHA (never stops the baseline)
    trainable.py   the Ray Tune function trainable around train()
    tracking.py    MLflow parent/child runs; tm.py the TM-relative score and its time basis
    callbacks.py   driver-side Tune callbacks: tracking and progress lines
    launch.py      run_sweep / resume_sweep; cli.py the `sweep` and `leaderboard` commands
    leaderboard.py MLflow -> the papers' table (md/csv/latex/html) and a Pareto plot
    importance.py  which swept keys matter per figure (fANOVA, seed-resampled intervals)
"""
