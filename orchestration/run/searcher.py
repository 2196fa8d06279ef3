"""One Tune searcher for every sweep: fixed trials first, then (optionally) Optuna.

- Fixed trials: the baseline under each seed, and for grid/random the whole expanded plan.
  Emitting the baselines first lets their scores exist early; they never reach Optuna.
- Optuna: each suggestion runs under every seed and Optuna is told the mean over the seeds,
  per objective (Ray's `Repeater` does the same for one metric only).
- Adaptive seeds (`seeds: {start, max, budget}`): the fixed trials are the first round;
  `SeedRounds` adds the next rounds, one seed at a time, where a claim is still open.

The state (what was handed out, the seed groups, Optuna's study, the rounds and every
finished trial's figures) is saved with Tune's experiment checkpoints, so `mtbert sweep
resume` continues the same plan: the n-th suggestion keeps its variant id and finds its
MLflow run again, and a resumed adaptive sweep adds the same seeds as one never stopped.
"""
from __future__ import annotations

import math
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from mtbert.figures import SUMMARY_KEY
from orchestration.sweep.labels import SINGLE_TASK, STANDS_FOR
from orchestration.sweep.plan import BASELINE, Planner, trial_key

TM_METRICS = {"tm_relative_score": "tm_time_s", "tm_relative_score_compute": "tm_flops"}
DELTA_M = "delta_m"  # taken against the single-task trials, as tracking takes it (SeedRounds.delta_m)


class SeedRounds:
    """Adaptive seeds over the planned configurations (the baseline and the reference
    included): seeds 0, 1, 2, ... in order, a round at a time (sweeps/README.md).

    When every trial of a round has ended, each claim is decided (verdicts.decide) on what its
    MLflow runs will hold, so that the verdict that stops a claim is the one `mtbert findings`
    gives it: a claim still undecided while its configurations have run fewer than `max` seeds
    (diverged ones included) is open, and its two configurations get its next paired seed (a
    claim on a TM-relative score also the baseline's: the score is taken against the same
    seed's baseline). A round that does not fit the budget whole takes the open claims in file
    order while they fit.

    A trial's figures are its run's (tracking.trial_figures of train()'s summary of the epochs
    Tune reported; its TM-relative scores and Δm% taken as tracking takes them); a trial that failed to train is diverged by the rule that tags its run
    (tracking.diverged_reason): left out of a figure's pairs, counted in a claim on the
    divergence rate. Everything here is plain data, saved with the searcher, so its field names
    are what a resumed sweep's checkpoint holds."""

    def __init__(self, planner: Planner, first: list[dict[str, Any]]):
        from orchestration.sweep.claims import configurations, sides

        sweep = planner.sweep
        self.design = sweep.adaptive
        self.claims = list(sweep.claims)
        self.configs: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {}  # variant -> role, values, extra
        for t in first:
            extra = {STANDS_FOR: t[STANDS_FOR]} if t.get(STANDS_FOR) else {}
            self.configs.setdefault(t["variant"], (t["role"], t["values"], extra))
        self.seeds = {v: sum(t["variant"] == v for t in first) for v in self.configs}  # handed out
        self.sides = {c.name: sides(c, configurations(first)) for c in self.claims}
        self.round = 1
        self.outstanding = {t["key"] for t in first}  # keys of this round not ended yet
        self.queue: list[dict[str, Any]] = []  # this round's trials not handed out yet
        self.handed = len(first)
        self.key_of: dict[str, str] = {}  # Tune trial id -> trial key
        self.shape: dict[str, dict[str, Any]] = {}  # key -> what its figures need of its config
        self.history: dict[str, dict[int, dict[str, float]]] = {}  # key -> epoch -> figures
        self.figures: dict[str, dict[str, float]] = {}  # key -> run figures of a finished trial
        self.summaries: dict[str, dict[str, float]] = {}  # key -> train()'s summary in its latest report
        self.diverged: dict[str, str] = {}  # key -> why, of each ended trial that failed to train
        self.rounds: list[dict[str, Any]] = []  # what each round decided, for the record
        self.finished: str | None = None  # why no round follows
        self.extended: list[int] = []  # the earlier maxima of a sweep given more seeds (extend)
        # budget.hours: the driver's wall time from its first trial on, so that the shared setup
        # (tokenizing, the frozen-layer cache, Ray's start: the parent run's setup_*_s) and the
        # time a stopped driver was down are not the trials'.
        self.spent_s = 0.0
        self._tick: float | None = None  # None: no trial handed out yet

    def _clock(self) -> None:
        if self._tick is None:
            return
        now = time.time()
        self.spent_s += max(now - self._tick, 0.0)
        self._tick = now

    def restored(self) -> None:
        self._tick = time.time()  # the time the driver was down is not the sweep's

    def budget_stopped(self) -> bool:
        """Whether the sweep ended at its budget (hours, trials) before its claims' maximum."""
        return (self.finished or "").startswith("budget")

    def extend(self, most: int) -> None:
        """More seeds for an ended sweep: open claims go on to `most` paired seeds. Past the
        sweep's maximum each claim's looks gain the new one (verdicts.extended_bounds: the looks
        taken keep their bounds); within it, after a budget stop, the looks go on as planned
        (each look's bound was set for all of them at once, so when the sweep stops or goes on
        does not change its rate). The sweep's own budget was the first part's."""
        from dataclasses import replace

        from orchestration.sweep.spec import AdaptiveSeeds

        if not (self.budget_stopped() and most <= self.design.max):
            self.extended = [*getattr(self, "extended", []), self.design.max]  # a state saved before the field
            self.claims = [replace(c, looks=(*(c.looks or (self.design.start, self.extended[-1])), most))
                           for c in self.claims]
        self.design = AdaptiveSeeds(start=self.design.start, max=most)
        self.finished = None
        self._tick = None  # budget.hours' clock: from the new first trial

    def handed_out(self, trial_id: str, config: dict[str, Any]) -> None:
        if self._tick is None:  # the first trial: the budget's clock starts
            self._tick = time.time()
        self.key_of[trial_id] = config["key"]
        full = config["config"]
        self.shape[config["key"]] = {"tasks": full.get("tasks", []),
                                     "train": {"epochs": full.get("train", {}).get("epochs", 0)}}

    def suggest(self, trial_id: str, planner: Planner) -> dict | str | None:
        if self.queue:
            config = self.queue.pop(0)
            self.handed_out(trial_id, config)
            return config
        if self.outstanding:
            return None  # the round's last trials are running: the next round depends on them
        if self.finished is None:
            self._next_round(planner)
            return self.suggest(trial_id, planner)
        return Searcher.FINISHED

    def on_result(self, trial_id: str, result: dict[str, Any]) -> None:
        key = self.key_of.get(trial_id)
        if key is None or "epoch" not in result:
            return
        from orchestration.track.tracking import report_figures

        # A resumed trial reports its epochs again: the latest report of an epoch wins.
        figures = {k: v for k, v in report_figures(result).items() if "/" not in k}  # not Tune's config/...
        self.history.setdefault(key, {})[int(result["epoch"])] = figures
        summary = result.get(SUMMARY_KEY)
        if isinstance(summary, dict):  # what tracking logs as the run's figures (tracking.trial_figures)
            self._field("summaries")[key] = {k: float(v) for k, v in summary.items() if isinstance(v, (int, float))}

    def on_complete(self, trial_id: str, result: dict | None, error: bool, planner: Planner) -> None:
        key = self.key_of.get(trial_id)
        if key is None or key not in self.outstanding:
            return
        if not error and not (result or {}).get("done"):
            return  # stopped by an interrupt, not ended: `sweep resume` runs it on
        self._clock()
        if not error and result:
            self.on_result(trial_id, result)
        from orchestration.run.trainable import failure
        from orchestration.track.tracking import diverged_reason, trial_figures

        history = self.history.get(key, {})
        final = trial_figures(history, self.shape[key], self._field("summaries").get(key))[0] if history else {}
        if not error and history:
            self.figures[key] = final
        # The rule tracking tags the run by: a failed trial's figures are not read, its reason is.
        why = diverged_reason(final, {} if error else history, failure(result))
        if why:
            self._field("diverged")[key] = why
        self.history.pop(key, None)
        self._field("summaries").pop(key, None)
        self.outstanding.discard(key)
        if not self.outstanding and not self.queue:
            self._next_round(planner)

    def _field(self, name: str) -> dict:
        """A field a checkpoint saved before it existed may lack: an empty one then."""
        return self.__dict__.setdefault(name, {})

    # ------------------------------------------------------------------ deciding

    def value(self, variant: str, seed: int, metric: str) -> float | None:
        figures = self.figures.get(trial_key(variant, seed))
        if figures is None:
            return None
        if metric in TM_METRICS:
            from orchestration.track.tm import mean_reference, trial_tm

            # As tracking scores the run (tracking._tm, at the sweep's end): against the same
            # seed's baseline, else the mean of the baselines that finished.
            baseline = self.figures.get(trial_key(BASELINE, seed))
            if baseline is None:
                bases = [self.figures[trial_key(BASELINE, s)] for s in range(self.seeds.get(BASELINE, 0))
                         if trial_key(BASELINE, s) in self.figures]
                baseline = mean_reference(bases) if bases else None
            return None if baseline is None else trial_tm(figures, baseline, TM_METRICS[metric])
        if metric == DELTA_M:
            return self.delta_m(variant, seed, figures)
        return figures.get(metric)

    def delta_m(self, variant: str, seed: int, figures: dict[str, float]) -> float | None:
        """Δm% as tracking takes it at the sweep's end (tracking._delta_m): against each task's
        single-task trial of the same seed, else the mean of the task's finished ones."""
        from orchestration.track.tm import single_task_scores, trial_delta_m

        if self.configs[variant][0] == SINGLE_TASK:
            return None
        singles = [(self.shape[key]["tasks"][0], str(s), self.figures[key])
                   for v, (role, _, _) in self.configs.items() if role == SINGLE_TASK
                   for s in range(self.seeds[v]) if (key := trial_key(v, s)) in self.figures]
        single = single_task_scores(singles, self.shape[trial_key(variant, seed)]["tasks"], str(seed), closing=True)
        return trial_delta_m(figures, single).get("delta_m")

    def per_seed(self, variant: str, metric: str) -> dict[int, float]:
        """seed -> figure of the variant's finished trials, as findings.per_seed reads their runs:
        a NaN stays (a run that did not train: the verdict counts it diverged), a figure that
        cannot be had (a TM score without a baseline) does not; for a claim on the divergence
        rate, 1 for each ended trial that diverged, 0 for each that trained."""
        from orchestration.report.verdicts import DIVERGED_METRIC

        gone = self.gone(variant)
        out = {}
        for seed in range(self.seeds[variant]):
            if metric == DIVERGED_METRIC:
                if seed in gone or trial_key(variant, seed) in self.figures:
                    out[seed] = float(seed in gone)
                continue
            value = self.value(variant, seed, metric)
            if value is not None:
                out[seed] = value
        return out

    def gone(self, variant: str) -> dict[int, str]:
        """seed -> why, of the variant's trials that failed to train (their runs' `diverged` tag)."""
        diverged = self._field("diverged")
        return {seed: diverged[trial_key(variant, seed)] for seed in range(self.seeds[variant])
                if trial_key(variant, seed) in diverged}

    def verdicts(self) -> dict[str, Any]:
        """Each claim decided on the trials so far, with its share of the sweep's error rate, as
        findings.judge_claims decides it on their runs (the same values and diverged seeds)."""
        from orchestration.report.verdicts import claim_alphas, decide

        out = {}
        for c, alpha in zip(self.claims, claim_alphas(self.claims)):
            a, b = self.sides[c.name][:2]
            out[c.name] = decide(self.per_seed(a, c.metric), self.per_seed(b, c.metric), c, alpha,
                                 diverged_a=self.gone(a), diverged_b=self.gone(b))
        return out

    def _next_round(self, planner: Planner) -> None:
        from orchestration.report.verdicts import OUTCOMES, is_open, next_targets

        self._clock()
        verdicts = self.verdicts()
        open_claims = [c for c in self.claims
                       if is_open(OUTCOMES.index(verdicts[c.name].outcome),
                                  min(self.seeds[v] for v in self.sides[c.name]), self.design.max)]
        budget = self.design.budget
        targets: dict[str, int] = {}
        cut = None
        if budget.hours is not None and self.spent_s >= budget.hours * 3600:
            cut = f"budget.hours spent: {self.spent_s / 3600:.2g} h of trial time"
        else:
            # A claim on a TM-relative score also takes the baseline: its score is taken against
            # the same seed's baseline.
            sides = [list(self.sides[c.name]) + ([BASELINE] if c.metric in TM_METRICS and BASELINE in self.configs
                                                 else []) for c in open_claims]
            room = None if budget.trials is None else budget.trials - self.handed
            targets, cut_short = next_targets(sides, self.seeds, room)
            cut = "budget.trials spent" if cut_short else None
        self.rounds.append({"round": self.round, "trials": self.handed,
                            "verdicts": {c.name: verdicts[c.name].outcome for c in self.claims},
                            "open": [c.name for c in open_claims], "next": {}})
        new = []
        for variant, n in targets.items():
            role, values, extra = self.configs[variant]
            for seed in range(self.seeds[variant], n):
                new.append({**planner.trial(variant, role, values, seed), **extra})
            self.rounds[-1]["next"][variant] = list(range(self.seeds[variant], n))
            self.seeds[variant] = n
        if not new:
            undecided = [c for c in self.claims if not verdicts[c.name].decided]
            self.finished = cut or ("every claim decided" if not undecided else
                                    f"{len(undecided)} undecided claim(s) at {self.design.max} seeds")
            self.rounds[-1]["end"] = self.finished
            return
        self.round += 1
        self.queue.extend(new)
        self.outstanding.update(t["key"] for t in new)
        self.handed += len(new)

    def describe_round(self) -> str:
        """One line on the last round's decision (for the console)."""
        last = self.rounds[-1]
        if "end" in last:
            return f"seeds: no round {last['round'] + 1} ({last['end']}) after {last['trials']} trials"
        adds = ", ".join(f"{v} seed {','.join(map(str, seeds))}" for v, seeds in last["next"].items())
        return (f"seeds: round {last['round'] + 1} for {len(last['open'])} open claim(s) "
                f"({'; '.join(last['open'])}): {adds}")


class SweepSearcher(Searcher):
    def __init__(self, planner: Planner, inner: Searcher | None = None,
                 metric: str | None = None, mode: str | None = None, announce: bool = False):
        super().__init__(metric=metric, mode=mode)
        self._planner = planner
        self._inner = inner
        self._announce = announce  # a console line per adaptive round (beside the progress lines)
        self._fixed = planner.fixed_trials()
        self._rounds = SeedRounds(planner, self._fixed) if planner.sweep.adaptive is not None else None
        self._next_fixed = 0
        self._fixed_ids: set[str] = set()
        self._inner_budget = planner.sweep.spec.num_samples if inner is not None else 0
        self._inner_made = 0
        self._queued: list[tuple[str, dict]] = []  # (primary trial id, config) of later seeds
        self._groups: dict[str, dict[str, Any]] = {}  # primary trial id -> {size, results}
        self._primary_of: dict[str, str] = {}

    @classmethod
    def restored(cls, folder: str | Path) -> "SweepSearcher":
        """The searcher a Tune run saved in its folder (Searcher.restore_from_dir), its planner
        and rounds included: what `sweep resume --seeds-max` goes on from."""
        from orchestration.errors import SweepError

        searcher = cls.__new__(cls)
        Searcher.__init__(searcher)
        searcher._inner = None
        try:
            searcher.restore_from_dir(str(folder))
        except RuntimeError:
            raise SweepError(f"{folder}: Ray Tune saved no searcher state there; the sweep cannot go on from it") from None
        return searcher

    @property
    def planner(self) -> Planner:
        return self._planner

    @property
    def rounds(self) -> SeedRounds | None:
        """The adaptive seeds' state (None for a list of seeds): what `sweep resume
        --seeds-max` reads of an ended sweep (its maximum, its trials, whether it ended)."""
        return self._rounds

    def extend(self, most: int) -> None:
        """SeedRounds.extend, and the sweep the planner plans by: at most `most` seeds each."""
        self._rounds.extend(most)
        self._planner.sweep.adaptive = self._rounds.design
        self._planner.sweep.claims = self._rounds.claims

    def round_pending(self) -> tuple[int, list[str]] | None:
        """Under adaptive seeds, (the round, the variants of its trials not yet handed to Tune);
        else None. Tune asks for a trial only when a slot is free, so its own PENDING count is
        0 while most of a round waits: the progress line counts and times the round's from here."""
        if self._rounds is None:
            return None
        return self._rounds.round, [t["variant"] for t in (*self._fixed[self._next_fixed:], *self._rounds.queue)]

    @property
    def total_trials(self) -> int:
        """The trials it hands out; under adaptive seeds, the most it may."""
        if self._rounds is not None:
            return self._planner.total_trials()
        return len(self._fixed) + self._inner_budget * len(self._planner.sweep.seeds)

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        # The space lives in the plan (and in the inner searcher, set up at construction).
        if metric and not self._metric:
            self._metric = metric
        if mode and not self._mode:
            self._mode = mode
        return True

    def suggest(self, trial_id: str) -> dict | None:
        if self._next_fixed < len(self._fixed):
            config = self._fixed[self._next_fixed]
            self._next_fixed += 1
            self._fixed_ids.add(trial_id)
            if self._rounds is not None:
                self._rounds.handed_out(trial_id, config)
            return config
        if self._rounds is not None:
            return self._rounds.suggest(trial_id, self._planner)
        if self._queued:
            primary, config = self._queued.pop(0)
            self._primary_of[trial_id] = primary
            return config
        if self._inner is None or self._inner_made >= self._inner_budget:
            return Searcher.FINISHED
        raw = self._inner.suggest(trial_id)
        if raw is None or raw == Searcher.FINISHED:
            return raw
        variant = f"o{self._inner_made:03d}"
        self._inner_made += 1
        configs = [self._planner.from_raw(raw, variant, seed) for seed in self._planner.sweep.seeds]
        self._groups[trial_id] = {"size": len(configs), "results": {}}
        self._primary_of[trial_id] = trial_id
        self._queued.extend((trial_id, c) for c in configs[1:])
        return configs[0]

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        # Optuna runs with a NopPruner here (ASHA stops trials), so intermediate values unused.
        if self._rounds is not None:
            self._rounds.on_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        from orchestration.run.trainable import failure

        error = error or bool(failure(result))  # a trial that ended itself failed (trainable.FAILED)
        if self._rounds is not None:
            rounds = len(self._rounds.rounds)
            self._rounds.on_complete(trial_id, result, error, self._planner)
            if self._announce and len(self._rounds.rounds) > rounds:
                print(self._rounds.describe_round(), flush=True)
            return
        if trial_id in self._fixed_ids or trial_id not in self._primary_of or self._inner is None:
            return
        primary = self._primary_of[trial_id]
        group = self._groups[primary]
        group["results"][trial_id] = None if error else result
        if len(group["results"]) < group["size"]:
            return
        ok = [r for r in group["results"].values() if r]
        metrics = self._inner.metric if isinstance(self._inner.metric, list) else [self._inner.metric]
        mean = {}
        for name in metrics:
            values = [float(r[name]) for r in ok if isinstance(r.get(name), (int, float))]
            values = [v for v in values if not math.isnan(v)]
            if values:
                mean[name] = sum(values) / len(values)
        if len(mean) < len(metrics):  # no seed of the group reported a metric (all failed)
            self._inner.on_trial_complete(primary, None, error=True)
        else:
            self._inner.on_trial_complete(primary, mean)

    # ------------------------------------------------------------------ checkpointing

    def get_state(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_inner", None)
        return state

    def set_state(self, state: dict) -> None:
        self.__dict__.update(state)
        if self._rounds is not None:
            self._rounds.restored()

    # One checkpoint file holds both: this searcher's state and the inner (Optuna) searcher's
    # own checkpoint, which it only writes to and reads from a path.
    def save(self, checkpoint_path: str) -> None:
        inner_blob = None
        if self._inner is not None:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp, "inner.pkl")
                self._inner.save(str(path))
                inner_blob = path.read_bytes()
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"state": self.get_state(), "inner": inner_blob}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            saved = pickle.load(f)
        self.set_state(saved["state"])
        if saved["inner"] is not None and self._inner is not None:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp, "inner.pkl")
                path.write_bytes(saved["inner"])
                self._inner.restore(str(path))


def make_searcher(planner: Planner, announce: bool = False) -> SweepSearcher:
    sweep = planner.sweep
    search = sweep.spec.search
    objectives = sweep.objectives
    inner = None
    if search.algorithm == "optuna":
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        metrics = [m for m, _ in objectives]
        modes = [d for _, d in objectives]
        multi = len(objectives) > 1 or search.objectives is not None
        inner = OptunaSearch(space=OptunaSearch.convert_search_space(planner.raw_space(expand_grid=False)),
                             metric=metrics if multi else metrics[0],
                             mode=modes if multi else modes[0], seed=search.seed)
    metric, mode = (objectives[0] if len(objectives) == 1 else (None, None))
    return SweepSearcher(planner, inner, metric=metric, mode=mode, announce=announce)
