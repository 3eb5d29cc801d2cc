"""What a model answers: each instance's label, ranked classes and scores, the basis items that
explain a class's score (see :meth:`service.model.predictor.Predictor.explain`), and one request
of several answered as one batch (:meth:`~service.model.predictor.Predictor.classify_many`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Answer:
    """The answer for one instance: the label, the best classes with scores, every class's
    score in the model's order of classes, and for documents how many of its words the
    vocabulary knows (0: the model answered an empty document).

    Made for every instance answered: slotted, not frozen (a frozen dataclass sets each field
    through ``object.__setattr__``, four times the cost of making it)."""

    label: str
    ranked: list[tuple[str, float]]
    scores: list[float]
    known_words: int | None = None
    explanation: Explanation | None = None


@dataclass(slots=True)
class Contribution:
    """What one basis item adds to a class's score: over every measure m,
    ``(raw similarity - offset) * folded weight`` (see :meth:`Predictor.explain`).

    Parameters
    ----------
    basis_index : int
        Its row in the basis.
    id : int or None
        Its id as the artifact keeps it (the row of the training set it was chosen from);
        None for artifacts written before ids were kept.
    label : str
        Its class.
    contribution : float
        What it adds to the score, the sum of ``measures``.
    share : float or None
        ``contribution / (score - intercept)``: the shares of every basis item sum to 1.
        None when ``score == intercept``.
    measures : list of float
        Its contribution through each measure, in the model's order of measures.
    """

    basis_index: int
    id: int | None
    label: str
    contribution: float
    share: float | None
    measures: list[float]


@dataclass(slots=True)
class Explanation:
    """Why a class got its score: the basis items that added most to it.

    ``score == intercept + sum(item.contribution for item in items) + rest``, up to rounding.

    Parameters
    ----------
    label : str
        The class explained (the predicted one).
    score : float
    intercept : float
        The class's SVM intercept b_k.
    items : list of Contribution
        The k items with the largest contributions, largest first.
    rest : float
        The contributions of every other basis item, summed.
    """

    label: str
    score: float
    intercept: float
    items: list[Contribution]
    rest: float

    def as_dict(self) -> dict[str, Any]:
        """The explanation as plain data (the service's JSON answers write it so)."""
        return {
            "label": self.label,
            "score": self.score,
            "intercept": self.intercept,
            "items": [
                {
                    "basis_index": item.basis_index,
                    "id": item.id,
                    "label": item.label,
                    "contribution": item.contribution,
                    "share": item.share,
                    "measures": item.measures,
                }
                for item in self.items
            ],
            "rest": self.rest,
        }


@dataclass(slots=True)
class ClassifyCall:
    """One request's part of :meth:`Predictor.classify_many`: what :meth:`Predictor.classify`
    takes (a caller with a default of its own may hold None in ``top_k`` until it applies
    it)."""

    instances: Any = None
    texts: Any = None
    top_k: int | None = 3
    explain: int = 0
