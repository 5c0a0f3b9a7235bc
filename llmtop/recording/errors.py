"""The one error type of the recording package: a user-facing problem with a file."""

from __future__ import annotations


class RecordingError(ValueError):
    """A recording cannot be read or written as asked (not a recording, a newer version, a file
    that already exists, ...). The message is one line for the user; the CLI exits 2."""
