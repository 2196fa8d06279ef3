"""Running a sweep: the planned trials on Ray Tune, locally or on a cluster.

    launch.py     run_sweep / resume_sweep: every check first, then Ray, Tune and the wrap-up
    trainable.py  the Ray Tune function trainable around mtbert's train()
    searcher.py   which trial next: baselines first, then the plan or Optuna; adaptive seeds
    scheduler.py  FIFO or ASHA (never stops the baseline)
    callbacks.py  the driver's Tune callback that sends every trial event to tracking
    progress.py   the driver's Tune callback that prints the progress lines
    stops.py      what both callbacks and launch.py share: a failed trial's one line, the
                  signals that stop a sweep (so launch.py imports them, never the reverse)
    storage.py    the room the sweep folder keeps, to stop cleanly when its disk fills
    remote.py     checks that run on every Ray node (paths visible, storage shared)
    jobs.py       sweeps as Ray Jobs: `mtbert sweep submit | status | stop`
    slurm.py      sweeps as SLURM batch jobs: `mtbert sweep slurm` (Ray started in the allocation)

The room that uses all the others: it reads the sweep (sweep/), writes through track/ and,
when a sweep ends, logs the report/ tables to its parent run.
"""
