"""Fitting what is asked for, on a data set or on shards: a
:class:`~training.estimator.estimator.BasisExpandingSVC` with the measures given or, with
``similarity="auto"``, the model selection wrapped around it
(:class:`~training.selection.forward_selection.ForwardSelectionCV`), built here (:func:`model_for`)
for the command line, the report and the tests, so that the estimator never builds its own
selector; and the model as the service holds it, with what happened while fitting it
(:class:`FitResult`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from sklearn.exceptions import ConvergenceWarning

from service.model import Predictor
from training.cluster.shards import ShardedData
from training.data.datasets import Dataset
from training.estimator.estimator import AUTO_SIMILARITY, BasisExpandingSVC
from training.selection.forward_selection import ForwardSelectionCV
from training.selection.state import DEFAULT_PREFERENCE


def model_for(
    similarity: str | None = None,
    *,
    selection_budget: float | None = None,
    selection_prefer: str = DEFAULT_PREFERENCE,
    selection_memory_budget: int | None = None,
    **params: Any,
) -> BasisExpandingSVC | ForwardSelectionCV:
    """The unfitted model that ``params`` ask for.

    Parameters
    ----------
    similarity : str or None, default=None
        The estimator's measures (None: its default); ``"auto"``: chosen by forward selection,
        which wraps the estimator of the other ``params`` (the selection's processes, seed and
        progress bars are the estimator's ``n_jobs``, ``random_state`` and ``verbose``).
    selection_budget : float or None, default=None
        With ``"auto"``: the selection's ``budget`` in seconds (None: it grows with the data);
        unused otherwise.
    selection_prefer : {"cost", "accuracy"}, default="cost"
        With ``"auto"``: the selection's ``prefer`` (what wins within the noise); unused
        otherwise.
    selection_memory_budget : int or None, default=None
        With ``"auto"``: the selection's ``memory_budget`` in bytes (None: a share of the
        memory available); unused otherwise.
    **params
        :class:`BasisExpandingSVC`'s other parameters.

    Returns
    -------
    BasisExpandingSVC or ForwardSelectionCV
    """
    if similarity is None or similarity.strip().lower() != AUTO_SIMILARITY:
        return BasisExpandingSVC(
            **params, **({} if similarity is None else {"similarity": similarity})
        )
    estimator = BasisExpandingSVC(**params)
    return ForwardSelectionCV(
        estimator,
        budget=selection_budget,
        prefer=selection_prefer,
        memory_budget=selection_memory_budget,
        n_jobs=estimator.n_jobs,
        random_state=0 if estimator.random_state is None else estimator.random_state,
        verbose=estimator.verbose,
    )


@dataclass
class FitResult:
    """A fitted model, as the service holds it, with what happened while fitting it.

    Attributes
    ----------
    model : BasisExpandingSVC or ForwardSelectionCV
        What was fitted.
    predictor : Predictor
        The model as the service holds it, named, with its training record (and, after a
        selection, the selection's).
    warnings : list of str
        The warnings the fit gave (on a data set: the solver's convergence warnings).
    """

    model: BasisExpandingSVC | ForwardSelectionCV
    predictor: Predictor
    warnings: list[str] = field(default_factory=list)

    @property
    def estimator(self) -> BasisExpandingSVC:
        """The fitted estimator: the model, or the selection's best."""
        return self.model.best_estimator_ if self.selection is not None else self.model

    @property
    def selection(self) -> ForwardSelectionCV | None:
        return self.model if isinstance(self.model, ForwardSelectionCV) else None

    @property
    def timings(self) -> dict[str, float]:
        return self.predictor.metadata["training"]["timings"]

    @property
    def train_accuracy(self) -> float:
        return self.estimator.train_accuracy_


def fit_dataset(
    dataset: Dataset, name: str, *, diagnostics: bool = True, **params: Any
) -> FitResult:
    """Fit :func:`model_for` ``params`` on the training split of ``dataset`` (the test split is
    never read) and name the model; convergence warnings are kept as notes.

    Parameters
    ----------
    dataset : Dataset
    name : str
        Model name recorded in the artifact.
    diagnostics : bool, default=True
        Compute NgRat/NgEng of every measure (an eigen-decomposition of each B x B basis Gram
        matrix: minutes for thousands of bases); off for throw-away fits.
    **params
        :func:`model_for`'s; ``input_shape`` comes from the data set.

    Returns
    -------
    FitResult
    """
    if len(set(dataset.y_train.tolist())) < 2:
        raise ValueError("the training split needs at least two classes")
    spec = dataset.input_spec
    model = model_for(**params, input_shape=None if spec.is_documents else str(spec))
    record = {"dataset": dataset.source}
    return _fitted(
        model, name, record, ConvergenceWarning, dataset.X_train, dataset.y_train, diagnostics
    )


def fit_shards(data: ShardedData, name: str, **params: Any) -> FitResult:
    """Fit :func:`model_for` ``params`` on every item of sharded data, on the cluster named by
    ``params["cluster"]`` (or, without one, in worker threads of this process), and name the
    model.

    Parameters
    ----------
    data : ShardedData
    name : str
    **params
        :func:`model_for`'s (``input_shape``: how to read the shards' rows).

    Returns
    -------
    FitResult
    """
    record = {"dataset": {"path": str(data.root), "shards": data.format}}
    return _fitted(model_for(**params), name, record, Warning, data)


def _fitted(model, name, record, kept: type[Warning], X, y=None, diagnostics=True) -> FitResult:
    """``model`` fitted on (X, y), its warnings of the ``kept`` kind as notes, and named."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model.fit(X, y)
    notes = [str(w.message) for w in caught if issubclass(w.category, kept)]
    predictor = model.to_predictor(name, record=record, diagnostics=diagnostics)
    if not diagnostics:
        predictor.metadata["diagnostics"] = {}
    return FitResult(model, predictor, notes)
