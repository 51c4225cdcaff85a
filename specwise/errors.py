"""The errors a user can cause: the CLI prints them as one line, the server as a 4xx."""

from specwise.runners.protocols import RollbackError


class ModelError(Exception):
    """A problem with a model the user can fix. `str()` is one line, printed without a traceback."""


USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, ModelError, RollbackError)
