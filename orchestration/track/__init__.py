"""Tracking a sweep in MLflow: what the driver writes while trials run, and what it logged.

    tracking.py   the driver's record of the sweep and its trials (journaled in the sweep
                  folder), and the one sync that makes the parent and child runs equal to it
    view.py       how the experiment opens in the UI: its kind, the configurations and seeds views, the link
    describe.py   what a run says of its source and data: Source tags, dataset inputs, data report
    system.py     the trial's CPU, memory and GPU figures, under MLflow's system metric names
    models.py     the best configuration, its model logged after the sweep, and the model
                  names a sweep prints, as `mtbert predict --model` accepts them
    tm.py         the TM-relative score and its time basis

Imports from sweep/ only (labels); it knows nothing of Ray Tune's run loop or of the reports.
"""
