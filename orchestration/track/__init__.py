"""Tracking a sweep in MLflow: what the driver writes while trials run, and what it logged.

    tracking.py       the driver's record of the sweep and its trials (journaled in the sweep
                      folder), and the one sync that makes the parent and child runs equal to it
    mlflow_extras.py  what makes the runs readable: experiment kind, saved view, data report,
                      system metrics, logged models, the best configuration
    tm.py             the TM-relative score and its time basis
    models.py         the model names a sweep prints, as `mtbert predict --model` accepts them

Imports from sweep/ only (labels); it knows nothing of Ray Tune's run loop or of the reports.
"""
