"""The errors a user can cause: the CLI prints them as one line, the server as a 4xx."""

from specwise.models.prepare import ModelError
from specwise.models.protocols import RollbackError

USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, ModelError, RollbackError)
