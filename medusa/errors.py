"""User-facing errors: the CLI prints them as one ``error: ...`` line and exits with status 2."""

import errno
import os
import stat


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


# operating-system errors that are the user's environment, not a bug: the CLI reports them in one line
USER_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES,
                         errno.EPERM, errno.ENOTEMPTY, errno.EXDEV, errno.EMFILE, errno.ENOTDIR, errno.EISDIR,
                         errno.EEXIST, errno.ENOENT, errno.ELOOP, errno.EFBIG, errno.EIO})


def os_error_line(exc: OSError) -> str:
    """``path: reason`` for an operating-system error (both paths of a rename); without a path, the reason
    and errno (a write that filled the disk reports no file name)."""
    reason = (exc.strerror or type(exc).__name__).lower()
    names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
    if names:
        return f"{' -> '.join(names)}: {reason}"
    return f"{reason} (errno {exc.errno})"


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISREG, "a file"))


def path_kind(path: "os.PathLike[str] | str") -> str:
    """What ``path`` is, in words, for messages: ``a file``, ``a directory``, ``a character device`` (such as
    /dev/null), ``a block device``, ``a named pipe``, ``a socket``; ``missing`` when nothing is there
    (symbolic links followed)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "missing"
    return next((name for test, name in _KINDS if test(mode)), "not a file")
