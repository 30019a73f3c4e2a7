"""User-facing errors: the CLI prints them as one ``error: ...`` line and exits with status 2."""


class MedusaError(Exception):
    """A problem with the user's input (a file, a row, a key, a checkpoint) rather than a bug.

    The message must name the offending file, line or key so that it can be fixed without a traceback.
    """


class CheckpointError(MedusaError):
    """A checkpoint directory is missing, corrupt, or does not match the base model."""


class ConfigError(MedusaError):
    """A recipe or config key is unknown, has the wrong type, or is out of range."""


class DataError(MedusaError):
    """A data file is missing or one of its rows is malformed."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty): one-line errors."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
