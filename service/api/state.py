"""The loaded model of a running service, or why there is none."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from service.model import ArtifactError, ModelNotReadyError, NotFoundError, Predictor
from service.model.search import SearchIndex

logger = logging.getLogger("service.api")


class ModelHolder:
    """Loads the artifact once; hands out the predictor or says why it is not ready.

    A failed load does not stop the server: it stays alive (``/healthz``) but not ready
    (``/readyz`` and predictions answer 503 with the reason), which is what an orchestrator needs
    to tell "starting" and "broken artifact" from "process dead".
    """

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.predictor: Predictor | None = None
        self.search: SearchIndex | None = None
        self.problem: str | None = "the model has not been loaded yet"

    def load(self) -> None:
        started = time.perf_counter()
        try:
            predictor = Predictor.load(self.model_dir)
            predictor.warm_up()
            # A broken search artifact fails the whole load: serving /classify while /search
            # silently vanished would hide the damage.
            search = SearchIndex.load(self.model_dir, predictor)
            if search is not None:
                search.warm_up()
        except ArtifactError as error:
            self.problem = f"model not loaded: {error}"
            logger.error(self.problem)
            return
        self.predictor, self.search, self.problem = predictor, search, None
        logger.info(
            "loaded model %r from %s in %.2f s (%d classes, %s, %d basis items)",
            predictor.name,
            self.model_dir,
            time.perf_counter() - started,
            len(predictor.classes),
            " + ".join(predictor.similarity_names),
            predictor.n_basis,
        )
        if search is not None:
            catalogue = search.catalogue
            logger.info(
                "search: %d atoms over %s features, catalogue of %s items",
                search.model.n_atoms,
                search.model.feature_space,
                "no" if catalogue is None else f"{catalogue.n_items:,}",
            )

    def require(self) -> Predictor:
        """The loaded predictor; raises :class:`ModelNotReadyError` if there is none."""
        if self.predictor is None:
            raise ModelNotReadyError(self.problem or "no model loaded")
        return self.predictor

    def require_search(self) -> SearchIndex:
        """The loaded search index; raises NotFoundError if the model has none."""
        predictor = self.require()
        if self.search is None:
            raise NotFoundError(
                f"model {predictor.name!r} has no search model: build one with "
                "python -m training dictionary, then python -m training index"
            )
        return self.search

    def require_named(self, name: str) -> Predictor:
        predictor = self.require()
        if name != predictor.name:
            raise NotFoundError(f"no model named {name!r}; this server has {predictor.name!r}")
        return predictor
