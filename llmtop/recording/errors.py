"""The one error type of the recording package: a user-facing problem with a file."""

from __future__ import annotations


class RecordingError(ValueError):
    """A recording cannot be read or written as asked (not a recording, a newer version, a file
    that already exists, ...). The message is one line for the user; the CLI exits 2."""


class RecordingBusy(RecordingError):
    """The file cannot be opened now for want of a file descriptor (the process or the
    system has none left): nothing wrong with the request; asking again later may work.
    The admin API answers it 503, not 400 (by ``retry_later``: it does not import this)."""

    retry_later = True
