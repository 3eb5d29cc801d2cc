"""HTTP routes. Thin on purpose: validate the envelope, call the model, shape the answer."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from service.api.schemas import (
    ClassifyRequest,
    ClassifyResponse,
    ClassScore,
    ErrorResponse,
    Health,
    InputInfo,
    ModelInfo,
    ModelList,
    Prediction,
    VocabularyInfo,
)
from service.api.settings import Settings
from service.api.state import ModelHolder
from service.model import NotFoundError, Predictor

router = APIRouter()


def _holder(request: Request) -> ModelHolder:
    return request.app.state.models


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _predictor(holder: Annotated[ModelHolder, Depends(_holder)]) -> Predictor:
    return holder.require()


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


def _model_info(predictor: Predictor) -> ModelInfo:
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
    )


@router.get("/v1/models", response_model=ModelList, tags=["models"], responses=_ERRORS)
def list_models(predictor: Annotated[Predictor, Depends(_predictor)]) -> ModelList:
    """Metadata of the served model: classes, input shape, similarities, basis size, created."""
    return ModelList(models=[_model_info(predictor)])


@router.get(
    "/v1/models/{name}",
    response_model=ModelInfo,
    tags=["models"],
    responses={404: {"model": ErrorResponse, "description": "No such model."}, **_ERRORS},
)
def get_model(name: str, holder: Annotated[ModelHolder, Depends(_holder)]) -> ModelInfo:
    """Metadata of one model, by name."""
    return _model_info(holder.require_named(name))


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
