"""HTTP routes. Thin on purpose: validate the envelope, call the model, shape the answer."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from service.api.schemas import (
    AtomHits,
    AtomResponse,
    ClassifyRequest,
    ClassifyResponse,
    ClassScore,
    ClassWeight,
    CodeOut,
    ErrorResponse,
    Health,
    InputInfo,
    ModelInfo,
    ModelList,
    Prediction,
    SearchHit,
    SearchInfo,
    SearchRequest,
    SearchResponse,
    VocabularyInfo,
)
from service.api.settings import Settings
from service.api.state import ModelHolder
from service.model import InvalidInputError, NotFoundError, Predictor
from service.model.search import SearchIndex, SearchQuery

router = APIRouter()


def _holder(request: Request) -> ModelHolder:
    return request.app.state.models


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _predictor(holder: Annotated[ModelHolder, Depends(_holder)]) -> Predictor:
    return holder.require()


def _search(holder: Annotated[ModelHolder, Depends(_holder)]) -> SearchIndex:
    return holder.require_search()


_ERRORS = {
    413: {"model": ErrorResponse, "description": "Batch or body over the configured limit."},
    422: {"model": ErrorResponse, "description": "Malformed request; the message says why."},
    503: {"model": ErrorResponse, "description": "No model loaded (yet)."},
}


@router.get("/healthz", response_model=Health, tags=["operations"])
def healthz() -> Health:
    """Liveness: the process answers."""
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    tags=["operations"],
    responses={503: {"model": ErrorResponse, "description": "No model loaded."}},
)
def readyz(holder: Annotated[ModelHolder, Depends(_holder)]) -> Health:
    """Readiness: a model is loaded and warmed up."""
    predictor = holder.require()
    return Health(status="ready", detail=f"model {predictor.name!r} loaded")


def _search_info(search: SearchIndex | None) -> SearchInfo | None:
    if search is None:
        return None
    model, meta = search.model, search.model.metadata
    return SearchInfo(
        feature_space=model.feature_space,
        n_atoms=model.n_atoms,
        n_features=model.n_features,
        n_nonzero=meta.get("n_nonzero"),
        catalogue_size=None if search.catalogue is None else search.catalogue.n_items,
        estimator=meta.get("estimator", {}),
        training=meta.get("training", {}),
    )


def _model_info(predictor: Predictor, search: SearchIndex | None) -> ModelInfo:
    meta = predictor.metadata
    return ModelInfo(
        name=predictor.name,
        model_type="besvm",
        created=meta.get("created"),
        input=InputInfo(
            kind=predictor.input_spec.kind,
            shape=list(predictor.input_spec.shape),
            spec=str(predictor.input_spec),
            accepts_texts=predictor.vocabulary is not None,
        ),
        classes=list(predictor.classes),
        similarities=predictor.similarity_names,
        vocabulary=None
        if predictor.vocabulary is None
        else {"size": predictor.vocabulary.size, **predictor.vocabulary.settings()},
        transform=str(predictor.transform),
        normalization=predictor.normalization,
        basis_size=predictor.n_basis,
        n_features=int(predictor.coef.shape[1]),
        diagnostics=meta.get("diagnostics", {}),
        training=meta.get("training", {}),
        versions=meta.get("versions", {}),
        search=_search_info(search),
    )


@router.get("/v1/models", response_model=ModelList, tags=["models"], responses=_ERRORS)
def list_models(holder: Annotated[ModelHolder, Depends(_holder)]) -> ModelList:
    """Metadata of the served model: classes, input shape, similarities, basis size, created."""
    return ModelList(models=[_model_info(holder.require(), holder.search)])


@router.get(
    "/v1/models/{name}",
    response_model=ModelInfo,
    tags=["models"],
    responses={404: {"model": ErrorResponse, "description": "No such model."}, **_ERRORS},
)
def get_model(name: str, holder: Annotated[ModelHolder, Depends(_holder)]) -> ModelInfo:
    """Metadata of one model, by name."""
    return _model_info(holder.require_named(name), holder.search)


@router.get(
    "/v1/models/{name}/vocabulary",
    response_model=VocabularyInfo,
    tags=["models"],
    responses={
        404: {"model": ErrorResponse, "description": "No such model, or it has no vocabulary."},
        **_ERRORS,
    },
)
def get_vocabulary(name: str, holder: Annotated[ModelHolder, Depends(_holder)]) -> VocabularyInfo:
    """The words of a text model, in index order: what sparse ``counts`` instances index."""
    vocabulary = holder.require_named(name).vocabulary
    if vocabulary is None:
        raise NotFoundError(f"model {name!r} reads no text: it has no vocabulary")
    return VocabularyInfo(
        size=vocabulary.size, terms=list(vocabulary.terms), **vocabulary.settings()
    )


@router.post("/classify", response_model=ClassifyResponse, tags=["predictions"], responses=_ERRORS)
def classify(
    body: ClassifyRequest,
    predictor: Annotated[Predictor, Depends(_predictor)],
    settings: Annotated[Settings, Depends(_settings)],
) -> ClassifyResponse:
    """Classify a batch: per instance the predicted label and the top-k classes with scores.

    Send ``instances`` in the model's input shape, or ``texts`` to a bag-of-words model."""
    answers = predictor.classify(
        body.instances,
        body.top_k or settings.default_top_k,
        settings.max_batch_size,
        texts=body.texts,
    )
    return ClassifyResponse(
        model=predictor.name,
        predictions=[
            Prediction(
                label=answer.label,
                top_k=[ClassScore(label=c, score=s) for c, s in answer.ranked],
                known_words=answer.known_words,
            )
            for answer in answers
        ],
    )


_SEARCH_ERRORS = {
    404: {"model": ErrorResponse, "description": "The model has no search model or catalogue."},
    **_ERRORS,
}


@router.post("/search", response_model=SearchResponse, tags=["search"], responses=_SEARCH_ERRORS)
def search(
    body: SearchRequest,
    index: Annotated[SearchIndex, Depends(_search)],
    settings: Annotated[Settings, Depends(_settings)],
) -> SearchResponse:
    """Rank the catalogue for a class, a sparse code, or examples, reading only the rows of
    X' = D^T X where the code is non-zero. Answers the top-k ids, best first, and the code."""
    query = SearchQuery(
        class_label=None if body.class_ is None else str(body.class_),
        code=None if body.code is None else (body.code.indices, body.code.values),
        bias=body.bias,
        positives=body.positives,
        negatives=body.negatives,
        top_k=body.top_k or settings.default_search_top_k,
        sparsity=body.sparsity,
        exclude=body.exclude,
        exclude_positives=body.exclude_positives,
        strongest_atoms=body.strongest_atoms,
    )
    result = index.run(
        query, max_top_k=settings.max_search_top_k, max_examples=settings.max_batch_size
    )
    code = result.code
    learned = result.kind == "positives"
    return SearchResponse(
        model=index.predictor.name,
        query=result.kind,
        code=CodeOut(indices=code.atoms.tolist(), values=code.weights.tolist(), bias=code.bias),
        sparsity=code.n_nonzero,
        results=_hits(result.items),
        strongest_atoms=[
            AtomHits(atom=a.atom, weight=a.weight, items=_hits(a.items))
            for a in result.strongest_atoms
        ]
        if body.strongest_atoms
        else None,
        n_positives=result.n_positives if learned else None,
        n_negatives=result.n_negatives if learned else None,
    )


@router.get(
    "/v1/models/{name}/atoms/{atom}",
    response_model=AtomResponse,
    tags=["search"],
    responses={
        404: {"model": ErrorResponse, "description": "No such model, atom or catalogue."},
        **_ERRORS,
    },
)
def get_atom(
    name: str,
    atom: int,
    holder: Annotated[ModelHolder, Depends(_holder)],
    settings: Annotated[Settings, Depends(_settings)],
    top_k: Annotated[int | None, Query(ge=1, description="Items to return (default 10).")] = None,
) -> AtomResponse:
    """The catalogue items that score highest on one atom alone (attribute discovery), and the
    classes whose codes use it."""
    holder.require_named(name)
    index = holder.require_search()
    k = top_k or settings.default_search_top_k
    if k > settings.max_search_top_k:
        raise InvalidInputError(f"top_k must be at most {settings.max_search_top_k}, got {k}")
    return AtomResponse(
        model=name,
        atom=atom,
        results=_hits(index.atom_items(atom, k)),
        classes=[ClassWeight(label=c, weight=w) for c, w in index.atom_classes(atom)],
    )


def _hits(items: list[tuple[str, float]]) -> list[SearchHit]:
    return [SearchHit(id=i, score=s) for i, s in items]
