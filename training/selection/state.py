"""The state of a selection: the current setting of the selected parameters, its
cross-validated correctness, the path so far and what each stage did, and the rule by which a
candidate replaces the current setting (:func:`take`).

A stage's best candidate is taken when its gain over the current configuration exceeds
``min_gain_se`` standard errors of the paired difference (each validation item's difference in
correctness, averaged over the repeats). Within the noise, the preference decides
(:data:`PREFERENCES`): ``cost`` (the default) keeps the current configuration unless a candidate
is cheaper to predict and at least as accurate; ``accuracy`` takes the candidate with the better
held-out score across the repeats, as a grid search would, the cheaper to predict only among
equals.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from training.selection.folds import FoldScorer, paired_gain
from training.selection.space import Candidate

# A step must gain more than this many standard errors of the paired difference to be a gain
# beyond the noise.
DEFAULT_MIN_GAIN_SE = 1.0

# What wins within the noise: the better held-out score, or the cheaper prediction. The cheaper
# by default: the better score within the noise gained on phoneme and lost on spambase (3 seeds
# each, docs/measurements/model-selection.md#what-wins-within-the-noise).
PREFERENCES = ("accuracy", "cost")
DEFAULT_PREFERENCE = "cost"


def take(
    current: np.ndarray,
    current_work: float,
    candidates: Sequence[tuple[np.ndarray, float]],
    min_gain_se: float,
    prefer: str = DEFAULT_PREFERENCE,
) -> tuple[int, float, float, str] | None:
    """Which candidate replaces the current configuration, if any: the most accurate of those
    whose gain exceeds ``min_gain_se`` standard errors of the paired difference; failing that,
    with ``prefer="accuracy"`` the most accurate of those with a better held-out score and of
    those as accurate and cheaper to predict, with ``prefer="cost"`` the most accurate of those
    cheaper to predict and at least as accurate; among equals the cheaper, then the first.

    Parameters
    ----------
    current : ndarray of shape (n_repeats, n_items), bool
        The current configuration's correctness on the validation items.
    current_work : float
        Its prediction work (:func:`prediction_work`).
    candidates : sequence of (ndarray, float)
        Each candidate's correctness on the same items and its prediction work.
    min_gain_se : float
    prefer : {"accuracy", "cost"}, default="cost"

    Returns
    -------
    (index, gain, standard_error, why) or None
        ``why`` is ``"gain"``, ``"more accurate, within the noise"`` or ``"cheaper, as
        accurate"``.
    """
    if prefer not in PREFERENCES:
        raise ValueError(f"prefer must be one of {PREFERENCES}, got {prefer!r}")
    better, within = [], []
    for index, (correct, work) in enumerate(candidates):
        gain, error = paired_gain(correct, current)
        entry = (gain, -work, -index, error)
        if gain > 0 and gain > min_gain_se * error:
            better.append(entry)
        elif (gain > 0 and prefer == "accuracy") or (gain >= 0 and work < current_work):
            within.append(entry)
    if better:
        gain, _, index, error = max(better)
        return -index, gain, error, "gain"
    if within:
        gain, _, index, error = max(within)
        why = "more accurate, within the noise" if gain > 0 else "cheaper, as accurate"
        return -index, gain, error, why
    return None


class SelectionState:
    """The current setting of the selected parameters, its cross-validated correctness, the
    path so far and what each stage did."""

    def __init__(
        self,
        scorer: FoldScorer,
        start: dict[str, Any],
        min_gain_se: float,
        started: float,
        work: Callable[[dict[str, Any]], float],
        prefer: str = DEFAULT_PREFERENCE,
    ):
        self.scorer = scorer
        self.current = start
        self.correct: np.ndarray | None = None
        self.min_gain_se = min_gain_se
        self.prefer = prefer
        self.started = started
        self.work = work
        self.path: list[dict[str, Any]] = []
        self.stages: list[dict[str, Any]] = []

    @property
    def accuracy(self) -> float:
        return float("nan") if self.correct is None else float(self.correct.mean())

    def vary(self, stage: str, name: str, values: Sequence[Any], describe: Callable) -> bool:
        """:meth:`step` over the current setting with parameter ``name`` set to each of
        ``values``; ``describe`` names a value in the path."""
        return self.step(
            stage, [Candidate(describe(value), {**self.current, name: value}) for value in values]
        )

    def step(self, stage: str, candidates: list[Candidate]) -> bool:
        """Score ``candidates`` (the starting configuration first, if it is not scored yet);
        take the one :func:`take` chooses. Whether a step was taken."""
        seen = [self.current]
        unique = []
        for candidate in candidates:
            if candidate.params not in seen:
                seen.append(candidate.params)
                unique.append(candidate)
        record = {"stage": stage, "candidates": len(unique), "scored": 0, "raced_out": 0}
        self.stages.append(record)
        record.update(cut=False, taken=False)
        if self.correct is None and not self._score_start(stage):
            record["cut"] = True
            return False
        if not unique:
            return False
        if self.scorer.out_of_time:
            record["cut"] = True
            return False
        scored = self.scorer(stage, unique, self.correct)
        done = [(c, m) for c, m in zip(unique, scored.correct, strict=True) if m is not None]
        record.update(
            scored=len(done),
            raced_out=scored.raced_out,
            cut=len(done) + scored.raced_out < len(unique),
        )
        choice = self._choose(done)
        if choice is None:
            return False
        candidate, correct, gain, error, why = choice
        self.current = candidate.params
        self.correct = correct
        self._log(stage, candidate, correct, gain, error, why)
        record["taken"] = True
        return True

    def _score_start(self, stage: str) -> bool:
        """Score the starting configuration, the reference of the first stage's candidates."""
        start = Candidate("start", self.current)
        if self.scorer.out_of_time:
            return False
        correct = self.scorer(stage, [start], None).correct[0]
        if correct is None:
            return False
        self.correct = correct
        self._log(stage, start, correct, 0.0, 0.0, "start")
        return True

    def _choose(self, done):
        """The candidate to take among ``done`` (candidate, correctness) pairs, or None."""
        taken = take(
            self.correct,
            self.work(self.current),
            [(correct, self.work(candidate.params)) for candidate, correct in done],
            self.min_gain_se,
            self.prefer,
        )
        if taken is None:
            return None
        index, gain, error, why = taken
        candidate, correct = done[index]
        return candidate, correct, gain, error, why

    def _log(self, stage, candidate, correct, gain, error, why) -> None:
        self.path.append(
            {
                "step": len(self.path) + 1,
                "stage": stage,
                "change": candidate.change,
                "similarity": candidate.params["similarity"],
                "cv_accuracy": float(correct.mean()),
                "gain": gain,
                "standard_error": error,
                "why": why,
                "candidates": self.stages[-1]["candidates"],
                "elapsed_s": round(time.monotonic() - self.started, 2),
            }
        )
