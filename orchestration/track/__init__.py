"""Tracking a sweep in MLflow: what the driver writes while trials run, and what it logged.

    tracking.py       one parent run per sweep, one child run per trial (the driver writes all)
    outbox.py         the queue and journal every MLflow write goes through (outages, resume)
    mlflow_extras.py  what makes the runs readable: experiment kind, saved view, data report,
                      system metrics, logged models, the best configuration
    tm.py             the TM-relative score and its time basis
    models.py         the model names a sweep prints, as `mtbert predict --model` accepts them

Imports from sweep/ only (labels); it knows nothing of Ray Tune's run loop or of the reports.
"""
