"""The domain error hierarchy.

Every error the library raises on purpose derives from :class:`ModelError`. The HTTP layer maps
each class to a status code in one place (``service.api.errors``); nothing else needs to know.
"""

import contextlib
from collections.abc import Iterator


class ModelError(Exception):
    """Base class of every deliberate error of the model library."""


@contextlib.contextmanager
def located(where: str) -> Iterator[None]:
    """Errors of the library raised inside the block say where they come from: the same class,
    its message prefixed with ``where`` (``searches[3]: top_k must be at least 1``)."""
    try:
        yield
    except ModelError as error:
        raise type(error)(f"{where}: {error}") from None


class InvalidInputError(ModelError, ValueError):
    """An input (an instance, a batch, a query) is malformed: wrong shape, type or value."""


class BatchTooLargeError(InvalidInputError):
    """A batch holds more instances than the configured limit."""


class ArtifactError(ModelError):
    """A model artifact cannot be read or written."""


class ArtifactIntegrityError(ArtifactError):
    """An artifact file is missing, truncated, tampered with or inconsistent with its manifest."""


class ArtifactChangedError(ArtifactIntegrityError):
    """A file of a served artifact was changed in place on disk (artifacts are replaced by
    rename, never rewritten in place)."""


class SnapshotRefusedError(ArtifactIntegrityError):
    """A catalogue snapshot that cannot be restored: damaged, partial, of a newer schema, or of
    a catalogue built for another search model. Nothing was written."""


class ArtifactVersionError(ArtifactError):
    """An artifact was written with a schema this version of the library does not know."""


class ModelNotReadyError(ModelError):
    """No model is loaded (yet): the service cannot answer predictions."""


class NotFoundError(ModelError, LookupError):
    """A named thing (a model, a class) does not exist."""


class SpecError(ModelError, ValueError):
    """A text specification (of a similarity measure or an input kind) cannot be parsed."""


def brief(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to about ``limit`` characters: error messages name what was wrong
    without echoing a huge input back whole."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 20]}...{text[-8:]} ({len(text):,} characters)"


class VersionConflictError(ModelError):
    """A request refers to a version that is no longer served (a page's cursor of a catalogue
    version since replaced)."""


class ShardsUnavailableError(ModelError):
    """Shards of a catalogue held elsewhere (a Dask cluster's workers) did not answer within
    their deadline."""
