"""``python -m service.api``: serve the model in MODEL_DIR with uvicorn."""

import copy

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from service.api.app import create_app
from service.api.settings import Settings


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
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=_logging_config(settings.log_level),
        access_log=settings.access_log,
    )


if __name__ == "__main__":
    main()
