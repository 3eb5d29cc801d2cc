"""A model's serving settings: ``serving.json`` beside its manifest, read with each version
(see :mod:`service.api.batching` for what its batching policy does)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from service.model import ArtifactError

# The file of a model's serving settings, beside its manifest.
SERVING_FILE = "serving.json"
# Its largest size: a few settings.
SERVING_FILE_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class BatchingPolicy:
    """How one model's requests are batched.

    Parameters
    ----------
    max_instances : int
        Most instances computed together; 0 or 1: no batching.
    max_delay_s : float
        How long a batch of fewer may wait for more, from its oldest request's arrival.
    """

    max_instances: int = 0
    max_delay_s: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.max_instances > 1


def read_serving_file(model_dir: Path) -> BatchingPolicy | None:
    """The batching policy of the model at ``model_dir``'s ``serving.json``, or None when it
    has none (the server's settings apply).

    The file is a JSON object; its ``dynamic_batching`` entry, if any, holds
    ``max_instances`` (an integer >= 0) and ``max_delay_ms`` (a number >= 0, default 0).

    Raises
    ------
    ArtifactError
        The file cannot be read, or is not of that form: the version is refused, saying why.
    """
    path = model_dir / SERVING_FILE
    try:
        with open(path, "rb") as file:
            raw = file.read(SERVING_FILE_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ArtifactError(f"{path}: cannot be read: {error}") from None
    if len(raw) > SERVING_FILE_MAX_BYTES:
        raise ArtifactError(f"{path}: larger than {SERVING_FILE_MAX_BYTES:,} bytes")
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise ArtifactError(f"{path}: not JSON: {error}") from None
    if not isinstance(document, dict):
        raise ArtifactError(f"{path}: must be a JSON object")
    batching = document.get("dynamic_batching")
    if batching is None:
        return None
    if not isinstance(batching, dict) or set(batching) - {"max_instances", "max_delay_ms"}:
        raise ArtifactError(
            f"{path}: dynamic_batching must be an object of max_instances and max_delay_ms"
        )
    instances, delay = batching.get("max_instances", 0), batching.get("max_delay_ms", 0)
    if type(instances) is not int or instances < 0:
        raise ArtifactError(f"{path}: dynamic_batching.max_instances must be an integer >= 0")
    if type(delay) not in (int, float) or not math.isfinite(delay) or delay < 0:
        raise ArtifactError(f"{path}: dynamic_batching.max_delay_ms must be a number >= 0")
    return BatchingPolicy(instances, delay / 1000.0)
