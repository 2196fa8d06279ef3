"""The bounds of what a sweep file may ask for, each checked at load, in one line naming its key.

Every configuration is planned and validated in the driver before Ray or MLflow start, and a
verdict over adaptive seeds simulates every look (orchestration/stats.py: about 16 MB per 10
looks): these keep that work, and the sweep, to a size a driver can hold.
"""
MAX_DIMENSIONS = 32  # entries of space:
MAX_CONFIGURATIONS = 1_000  # searched configurations: grid points (and simplex lattices) x num_samples
MAX_SEEDS = 50  # seeds of a list, and adaptive seeds' max
MAX_TRIALS = 5_000  # configurations x seeds (adaptive: at max, or the budget); each is planned at load
MAX_HOURS = 24 * 366  # seeds.budget.hours
MAX_CLAIMS = 200  # entries of claims:
MAX_OUTAGE_S = 7 * 24 * 3600  # tracking.outage_s
