"""``python -m service.api``: serve the model repository (or MODEL_DIR) with uvicorn.

With ``WORKERS`` > 1, uvicorn starts that many processes on one listening socket; each builds
the app from the environment and loads the repository itself (memory-mapped catalogues share
their pages between them).
"""

import copy
import os

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from service.api.app import create_app
from service.api.settings import Settings
from service.model.threads import worker_environment


def _logging_config(level: str) -> dict:
    """uvicorn's logging, with the service's own logger on uvicorn's console handler."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["service"] = {
        "handlers": ["default"],
        "level": level.upper(),
        "propagate": False,
    }
    return config


def main() -> None:
    settings = Settings()
    options = dict(
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=_logging_config(settings.log_level),
        access_log=settings.access_log,
        # Keep-alive connections outlive a short pause of a client's (uvicorn's default is 5 s).
        timeout_keep_alive=30,
    )
    if settings.workers > 1:
        # Worker processes import the factory by name and read the same environment, which
        # sizes their thread pools so that together they do not oversubscribe the cores.
        os.environ.update(worker_environment(settings.workers))
        uvicorn.run("service.api.app:create_app", factory=True, workers=settings.workers, **options)
    else:
        uvicorn.run(create_app(settings), **options)


if __name__ == "__main__":
    main()
