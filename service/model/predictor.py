"""A trained Basis Expanding SVM: prediction on plain arrays, and its artifact form.

The hot path is plain numpy and numba on the stored arrays: the model's input kind turns the
client's payload into items (dense inputs: transform, e.g. HOG, then normalise; documents: sparse
word counts, from raw text through the stored vocabulary), the bound measures compare them with
the basis, and one matrix product of the raw similarities with weights that have the
normalisation folded in gives the one-vs-rest scores (measures linear in the input, dense
``linear``, are folded further into weights on the input and never computed).
Everything that depends only on the model (which input kind, which drivers, the grid, the folded
weights) is settled once when the predictor is built or loaded; see
:mod:`service.model.inputs`. scikit-learn is not involved at serving time (its per-call
overhead dominates at batch size 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.model.answers import Answer, Contribution, Explanation
from service.model.errors import ArtifactIntegrityError, InvalidInputError, SpecError
from service.model.features import NORMALIZATIONS, expand
from service.model.inputs.base import InputKind, join_items
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import InputTransform
from service.model.inputs.words import Documents, Vocabulary
from service.model.kernels.scores import top_contributions
from service.model.predictor_artifact import PredictorArtifact
from service.model.scoring import Scorer, best_first, check_top_k, rank_classes
from service.model.similarity import SimilaritySpec, format_spec
from service.model.threads import SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS


@dataclass(frozen=True, eq=False)
class Predictor(PredictorArtifact):
    """A Basis Expanding SVM ready to predict.

    Parameters
    ----------
    name : str
    inputs : InputKind
        What clients send and how it becomes items the measures compare, with the basis:
        :class:`~service.model.inputs.dense.DenseInputs` (transform, input mean and scale, array
        basis) or :class:`~service.model.inputs.documents.DocumentInputs` (idf, vocabulary, word
        count basis).
    classes : tuple of str, length K
    specs : tuple of SimilaritySpec, length M
    normalization : str
    basis_labels : ndarray of shape (B,), int
        Index into ``classes`` of each basis item.
    feature_offset, feature_scale : ndarray of shape (M * B,)
    coef : ndarray of shape (K, M * B)
    intercept : ndarray of shape (K,)
    feature_projection : ndarray of shape (M, B, B), optional
        Nystroem normalisations only.
    basis_ids : ndarray of shape (B,), int, optional
        Each basis item's id: the row of the training set it was chosen from. Explanations
        name the items by it; artifacts written before it was kept have none.
    metadata : dict
        Everything else the manifest records (training summary, created time, versions).

    Raises
    ------
    ArtifactIntegrityError
        The parts do not make one consistent model.
    """

    name: str
    inputs: InputKind
    classes: tuple[str, ...]
    specs: tuple[SimilaritySpec, ...]
    normalization: str
    basis_labels: np.ndarray
    feature_offset: np.ndarray
    feature_scale: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray
    feature_projection: np.ndarray | None = None
    basis_ids: np.ndarray | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # One dtype and layout for every array, so the compiled kernels see one signature.
        for name in self._float_arrays:
            array = np.ascontiguousarray(getattr(self, name), dtype=np.float64)
            object.__setattr__(self, name, array)
        if self.basis_ids is not None:
            object.__setattr__(self, "basis_ids", np.asarray(self.basis_ids, dtype=np.int64))
        try:
            measures = self.inputs.bind(self.specs)
        except SpecError as error:
            raise ArtifactIntegrityError(
                f"model {self.name!r} is inconsistent: inputs {self.input_spec}: {error}"
            ) from None
        problems = self.inputs.problems() or self._consistency_problems()
        if problems:
            raise ArtifactIntegrityError(f"model {self.name!r} is inconsistent: {problems[0]}")
        # Derived once: the hot path needs these on every call.
        object.__setattr__(self, "_measures", measures)
        object.__setattr__(self, "_scorer", self._build_scorer(measures))

    def _build_scorer(self, measures) -> Scorer:
        """The hot path's plan: the normalisation folded into the weights, and measures that
        are linear in the input folded further into weights on the input."""
        weights, intercept = self._fold_normalization()
        n_basis = self.n_basis
        basis = self.inputs.basis_items
        computed, computed_rows, on_inputs, positions = [], [], [], []
        for m, measure in enumerate(measures):
            block = weights[m * n_basis : (m + 1) * n_basis]
            input_weights = measure.input_weights(basis, block)
            if input_weights is None:
                computed.append(measure)
                computed_rows.append(slice(m * n_basis, (m + 1) * n_basis))
                positions.append(m)
            else:
                on_inputs.append((measure, input_weights))

        def computed_part(values: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(np.concatenate([values[rows] for rows in computed_rows]))

        scorer = Scorer(
            tuple(computed),
            computed_part(weights) if computed else None,
            tuple(on_inputs),
            intercept,
            tuple(positions),
            weights,
        )
        if not computed:
            return scorer
        return Scorer.reading_what_counts(
            scorer, basis, computed_part(self.feature_scale), computed_part(self.feature_offset)
        )

    def _fold_normalization(self) -> tuple[np.ndarray, np.ndarray]:
        r"""Weights and intercepts applied to the raw similarities, shapes (M * B, K) and (K,).

        Scores are linear in the features, and the normalisation is an affine map followed by a
        linear projection (Nystroem), so with :math:`\varphi = ((\tilde\varphi - o) / s) P`,

        .. math:: \varphi w + c = \tilde\varphi \, \mathrm{diag}(1/s) P w
                                  + (c - (o / s) P w)

        Folding once saves, per instance, a B x B product and two passes over the features.
        """
        weights = np.array(self.coef.T, order="C")  # a copy: divided in place below
        if self.feature_projection is not None:
            n_basis = self.n_basis
            for m, block_projection in enumerate(self.feature_projection):
                block = slice(m * n_basis, (m + 1) * n_basis)
                weights[block] = block_projection @ weights[block]
        weights /= self.feature_scale[:, None]
        intercept = self.intercept - self.feature_offset @ weights
        return weights, intercept

    @property
    def _float_arrays(self) -> tuple[str, ...]:
        if self.feature_projection is None:
            return _FLOAT_ARRAYS
        return (*_FLOAT_ARRAYS, "feature_projection")

    def _consistency_problems(self) -> list[str]:
        n_basis = self.n_basis
        n_features, n_classes = len(self.specs) * n_basis, len(self.classes)
        expected = {
            "basis_labels": (self.basis_labels, (n_basis,)),
            "feature_offset": (self.feature_offset, (n_features,)),
            "feature_scale": (self.feature_scale, (n_features,)),
            "coef": (self.coef, (n_classes, n_features)),
            "intercept": (self.intercept, (n_classes,)),
        }
        if self.basis_ids is not None:
            expected["basis_ids"] = (self.basis_ids, (n_basis,))
        if self.normalization.startswith("nystroem"):
            expected["feature_projection"] = (
                np.empty(0) if self.feature_projection is None else self.feature_projection,
                (len(self.specs), n_basis, n_basis),
            )
        elif self.feature_projection is not None:
            return [f"a feature_projection makes no sense with {self.normalization}"]
        problems = [
            f"{name} has shape {array.shape}, expected {shape}"
            for name, (array, shape) in expected.items()
            if array.shape != shape
        ]
        if n_classes < 2 or len(set(self.classes)) != n_classes:
            problems.append(f"needs at least two distinct classes, got {list(self.classes)}")
        if not self.specs:
            problems.append("needs at least one similarity")
        if self.normalization not in NORMALIZATIONS:
            problems.append(f"unknown normalization {self.normalization!r}")
        if not problems and not (self.feature_scale > 0).all():
            problems.append("feature_scale must be positive")
        if not problems:
            problems += [
                f"{name} holds NaN or infinity"
                for name in self._float_arrays
                if not np.isfinite(getattr(self, name)).all()
            ]
        return problems

    # -- what the model reads ---------------------------------------------------------------

    @property
    def input_spec(self) -> InputSpec:
        """What one client instance is."""
        return self.inputs.spec

    @property
    def transform(self) -> InputTransform:
        """Applied to every instance first (``none`` for documents); measures written without
        a transform of their own read its output."""
        return self.inputs.transform

    @property
    def measure_transforms(self) -> list[str]:
        """The transform each measure reads, canonical text, in the order of :attr:`specs`."""
        return [str(spec.transform_or(self.transform)) for spec in self.specs]

    def describe_measures(self) -> list[dict[str, str]]:
        """Each measure without its transform and the transform it reads, in the order of
        :attr:`specs`: ``[{"similarity": "rbf(gamma=1)", "transform": "pixels"}, ...]``."""
        return [
            {"similarity": spec.measure_name, "transform": transform}
            for spec, transform in zip(self.specs, self.measure_transforms, strict=True)
        ]

    @property
    def vocabulary(self) -> Vocabulary | None:
        """Turns raw text into counts; None if the model reads no text."""
        return self.inputs.vocabulary

    @property
    def grid_shape(self) -> tuple[int, int, int] | None:
        """Layout of a transformed instance, which grid measures need."""
        return self.inputs.grid_shape

    @property
    def n_basis(self) -> int:
        return self.inputs.n_basis

    @property
    def similarity_names(self) -> list[str]:
        return [format_spec(s) for s in self.specs]

    # -- prediction -------------------------------------------------------------------------

    def validate(self, instances, names=None) -> np.ndarray | Documents:
        """A client's instances as a batch (see :meth:`InputKind.parse`): a flat float64 array
        from nested lists, or :class:`Documents` from ``{"indices", "counts"}`` objects;
        ``names`` (sequence of str) are what messages call each instance."""
        return self.inputs.parse(instances, names)

    def validate_prepared(self, instances, names=None):
        """:meth:`validate`, and the batch prepared as the measures read it (see
        :meth:`InputKind.parse_prepared`): each transform computed once, for the checks and for
        :meth:`prepared_features` / :meth:`prepared_normalized`.

        Returns
        -------
        batch, items
        """
        return self.inputs.parse_prepared(instances, names)

    def prepared_features(self, items) -> np.ndarray:
        """:meth:`features` of items already prepared: ndarray of shape (n_samples, M * B)."""
        return expand(
            items,
            self.inputs.basis_items,
            self._measures,
            self.feature_offset,
            self.feature_scale,
            projection=self.feature_projection,
        )

    def prepared_normalized(self, items) -> np.ndarray:
        """:meth:`normalized_inputs` of items already prepared: ndarray of shape (n_samples, d).

        Raises
        ------
        InvalidInputError
            The model reads documents, which have no such form.
        """
        return self.inputs.normalized_of(items)

    def encode_texts(self, texts) -> Documents:
        """Raw texts as documents over the model's vocabulary (unknown words dropped).

        Raises
        ------
        InvalidInputError
            The model has no vocabulary, the batch is empty or an item is not a string.
        """
        return self.inputs.parse_texts(texts)

    def normalized_inputs(self, X) -> np.ndarray:
        """Inputs as the basis sees them: transformed, centred and scaled (dense models only).

        Parameters
        ----------
        X : ndarray of shape (n_samples, input_spec.n_features)

        Returns
        -------
        ndarray of shape (n_samples, d)
            ``d`` is the length of a transformed instance (for a model over several transforms,
            of every transform's side by side).

        Raises
        ------
        InvalidInputError
            The model reads documents, which have no such form.
        """
        return self.inputs.normalized(X)

    def features(self, X) -> np.ndarray:
        """Basis-expanded features of raw (untransformed, un-normalised) inputs.

        Parameters
        ----------
        X : ndarray of shape (n_samples, input_spec.n_features), or documents
            What :meth:`InputKind.batch` takes: for documents, texts, a sparse count matrix or
            :class:`Documents`.

        Returns
        -------
        ndarray of shape (n_samples, M * B)
        """
        return self.prepared_features(self.inputs.prepare(self.inputs.batch(X)))

    def decision_function(self, X) -> np.ndarray:
        """One-vs-rest scores ``w_k . phi(x) + b_k``.

        Parameters
        ----------
        X : ndarray of shape (n_samples, input_spec.n_features), or documents
            As :meth:`features` takes them.

        Returns
        -------
        scores : ndarray of shape (n_samples, K)
        """
        return self._scores(self.inputs.prepare(self.inputs.batch(X)))

    def _scores(self, items: np.ndarray | Documents) -> np.ndarray:
        """Scores of prepared items, shape (n_samples, K): the hot path, no checks."""
        return self._scorer(items, self.inputs.basis_items)

    def runs_serially(self, n_samples: int, *, explain: bool = False) -> bool:
        """Whether scoring ``n_samples`` inputs is light work on the calling thread: every
        measure whose similarities are computed is light (see
        :meth:`~service.model.similarity.BoundSimilarity.runs_serially`: no parallel region, so
        no wait for :data:`service.model.threads.PARALLEL_REGION`), in each of the scorer's
        computations (blocks of rows, against the basis items in use; with ``explain``, the
        whole batch against every item, for every measure). Without ``explain``, measures folded
        into weights on the input cost one small product and count as light. The input transform
        must be light too (a HOG batch past its threshold runs in parallel)."""
        if not self.inputs.prepares_serially(n_samples):
            return False
        rows, n_basis = self._scorer.similarity_calls(n_samples, self.n_basis, every_item=explain)
        # An explanation also computes the similarities of the measures folded into weights.
        measures = self._measures if explain else self._scorer.computed
        return all(measure.runs_serially(rows, n_basis) for measure in measures)

    def predict(self, X) -> np.ndarray:
        """Predicted class labels, shape (n_samples,)."""
        return np.asarray(self.classes)[self.decision_function(X).argmax(axis=1)]

    def top_k(self, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best classes of each row of ``scores``, best first.

        Parameters
        ----------
        scores : ndarray of shape (n_samples, K)
        k : int
            Clipped to K.

        Returns
        -------
        indices, top_scores : ndarray of shape (n_samples, min(k, K))
        """
        order = best_first(scores, k)
        return order, np.take_along_axis(scores, order, axis=1)

    def classify(
        self, instances=None, top_k: int = 3, *, texts=None, explain: int = 0
    ) -> list[Answer]:
        """Validate a client batch and answer it: the label and top-k classes of each instance.

        Batch size limits belong to the caller (the service's data plane).

        Parameters
        ----------
        instances : sequence, optional
            Nested lists (see :meth:`InputSpec.as_batch`), or for ``counts(W)`` models
            ``{"indices": [...], "counts": [...]}`` objects. Exactly one of ``instances`` and
            ``texts``.
        top_k : int
            Classes per instance, clipped to the number of classes.
        texts : sequence of str, optional, keyword-only
            Raw documents, for models with a vocabulary.
        explain : int, default=0, keyword-only
            With k > 0, each answer's :attr:`Answer.explanation`: the k basis items that added
            most to the predicted class's score (see :meth:`explain`), k clipped to B.

        Returns
        -------
        list of Answer, one per instance
            Its label, its ``top_k`` best classes ranked, and every class's score in the order
            of :attr:`classes` (whatever ``top_k``).

        Raises
        ------
        InvalidInputError
            Neither or both of ``instances`` and ``texts``, an empty batch, a malformed
            instance, ``top_k`` below 1, ``explain`` below 0, or texts for a model without a
            vocabulary.
        """
        batch, items = self._parsed(instances, texts, explain)
        if not explain:
            return self._answers(self._scores(items), batch, top_k)
        scores, similarities = self._scorer.scored(items, self.inputs.basis_items)
        return self._answers(scores, batch, top_k, explain, items, similarities)

    def classify_many(self, calls) -> list[list[Answer] | InvalidInputError]:
        """Answer several requests as one batch: each validated on its own, then every valid
        one's instances scored together (one matrix product instead of one per request), and
        each answered as :meth:`classify` answers it.

        Parameters
        ----------
        calls : sequence of ClassifyCall

        Returns
        -------
        list, one per call
            Its answers, or the InvalidInputError that refused it (one bad request fails
            alone).
        """
        outcomes: list = [None] * len(calls)
        valid = []
        for i, call in enumerate(calls):
            try:
                check_top_k(call.top_k)
                valid.append((i, call, *self._parsed(call.instances, call.texts, call.explain)))
            except InvalidInputError as error:
                outcomes[i] = error
        if not valid:
            return outcomes
        items = join_items([v[3] for v in valid])
        if any(call.explain for _, call, *_ in valid):
            scores, similarities = self._scorer.scored(items, self.inputs.basis_items)
        else:  # in blocks (Scorer.__call__): no similarities kept
            scores, similarities = self._scores(items), None
        start = 0
        for i, call, batch, part in valid:
            rows = slice(start, start + len(part))
            start = rows.stop
            outcomes[i] = self._answers(
                scores[rows],
                batch,
                call.top_k,
                call.explain,
                part,
                None if similarities is None else similarities[rows],
            )
        return outcomes

    def _parsed(self, instances, texts, explain: int):
        """A request's batch and its items, prepared: every check of :meth:`classify`."""
        if (instances is None) == (texts is None):
            raise InvalidInputError("send either instances or texts, not both and not neither")
        if explain < 0:
            raise InvalidInputError(f"explain must be at least 0, got {explain}")
        inputs = self.inputs
        if texts is None:
            return inputs.parse_prepared(instances)
        batch = inputs.parse_texts(texts)
        return batch, inputs.prepare(batch)

    def _answers(
        self, scores, batch, top_k: int, explain: int = 0, items=None, similarities=None
    ) -> list[Answer]:
        """The answers of one request's ``scores`` (its rows of ``similarities`` and its
        ``items`` for explanations)."""
        rows = scores.tolist()
        rankings = rank_classes(scores, rows, top_k)
        known = self.inputs.known_words(batch)
        classes = self.classes
        answers = [
            Answer(
                label=classes[ranking[0]],
                ranked=[(classes[c], row[c]) for c in ranking],
                scores=row,
                known_words=None if known is None else known[i],
            )
            for i, (ranking, row) in enumerate(zip(rankings, rows, strict=True))
        ]
        if explain:
            best = [ranking[0] for ranking in rankings]
            raw = self._scorer.all_similarities(
                items, self.inputs.basis_items, similarities, self._measures
            )
            for answer, explanation in zip(
                answers, self._explanations(raw, best, rows, explain), strict=True
            ):
                answer.explanation = explanation
        return answers

    def explain(self, X, k: int = 5) -> list[Explanation]:
        r"""The k basis items that added most to each input's predicted class's score.

        The score of class c is linear in the normalised similarities
        :math:`\varphi = ((\tilde\varphi - o) / s) P` (P: Nystroem's projection, else the
        identity), so with the weights folded through the normalisation,
        :math:`W_c = \mathrm{diag}(1/s) P w_c`, basis item j of measure m adds
        :math:`(\tilde\varphi_{mj} - o_{mj}) W_{mj,c}`, and these add up exactly to
        :math:`\mathrm{score}_c - b_c` (docs/how-it-works/design.md, "Explanations").

        Parameters
        ----------
        X : ndarray of shape (n_samples, input_spec.n_features), or documents
            As :meth:`features` takes them.
        k : int
            Items per explanation, clipped to B.

        Returns
        -------
        list of Explanation, one per input
        """
        if k < 1:
            raise InvalidInputError(f"k must be at least 1, got {k}")
        items = self.inputs.prepare(self.inputs.batch(X))
        scores, similarities = self._scorer.scored(items, self.inputs.basis_items)
        raw = self._scorer.all_similarities(
            items, self.inputs.basis_items, similarities, self._measures
        )
        rows = scores.tolist()
        best = [max(range(len(row)), key=row.__getitem__) for row in rows]
        return self._explanations(raw, best, rows, k)

    def _explanations(self, raw, best, rows, k: int) -> list[Explanation]:
        """Explanations of the classes ``best`` (one per row of ``raw``, the raw similarities
        of every measure) whose scores are in ``rows``."""
        n_basis, n_measures = self.n_basis, len(self.specs)
        k = min(k, n_basis)
        weights, offset = self._scorer.weights, self.feature_offset
        ids, labels = self._basis_names()
        n = len(best)
        indices, values = np.empty((n, k), dtype=np.int64), np.empty((n, k))
        measures, totals = np.empty((n, k, n_measures)), np.empty(n)
        columns = np.asarray(best, dtype=np.int64)
        top_contributions(raw, offset, weights, columns, n_measures, indices, values, measures,
                          totals)  # fmt: skip
        explanations = []
        per_row = zip(
            best, indices.tolist(), values.tolist(), measures.tolist(), totals.tolist(), strict=True
        )
        for i, (c, row_indices, row_values, row_measures, total) in enumerate(per_row):
            score, intercept = rows[i][c], float(self.intercept[c])
            explained = score - intercept
            items = [
                Contribution(
                    basis_index=j,
                    id=None if ids is None else ids[j],
                    label=labels[j],
                    contribution=value,
                    share=value / explained if explained != 0 else None,
                    measures=per_measure,
                )
                for j, value, per_measure in zip(row_indices, row_values, row_measures, strict=True)
            ]
            rest = total - sum(row_values)
            explanations.append(Explanation(self.classes[c], score, intercept, items, rest))
        return explanations

    def _basis_names(self) -> tuple[list[int] | None, list[str]]:
        """Each basis item's id (None without ids) and its class's label, as lists (made once:
        an explanation reads k of them)."""
        names = self.__dict__.get("_names")
        if names is None:
            ids = None if self.basis_ids is None else self.basis_ids.tolist()
            labels = [self.classes[c] for c in self.basis_labels.tolist()]
            names = (ids, labels)
            object.__setattr__(self, "_names", names)
        return names

    def warm_up(self) -> None:
        """Run the whole prediction path, serial and parallel, and an explanation, so compiled
        kernels are loaded."""
        work_per_row = self.n_basis * min(measure.pair_work for measure in self._measures)
        # Two rows at least: a transform runs one image on the calling thread (bof), two or more
        # in parallel when heavy.
        for rows in (1, max(2, int(SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS // work_per_row) + 1)):
            items = self.inputs.prepare(self.inputs.batch(self.inputs.warm_up_batch(rows)))
            self._scores(items)
            # Scores read the basis items in use, in blocks, which may keep every call light:
            # the whole basis at once, as explanations read it, reaches the parallel drivers.
            self._scorer.scored(items, self.inputs.basis_items)
        self.explain(self.inputs.warm_up_batch(1), 1)


_FLOAT_ARRAYS = ("feature_offset", "feature_scale", "coef", "intercept")
