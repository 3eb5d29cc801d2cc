"""The HTTP layer: settings, schemas, routes, the app factory; the work is in service.model."""

from service.api.app import create_app
from service.api.settings import Settings

__all__ = ["Settings", "create_app"]
