"""The one exception type for mistakes a user can fix (paths, flags, unsupported models).

The CLI prints its message as one line and exits non-zero; everything else is a bug and keeps
its traceback."""


class UserError(Exception):
    """A problem the user can fix; the message says what happened and what to do."""
