"""The one exception type for mistakes a user can fix (paths, flags, unsupported models).

The CLI prints its message as one line and exits non-zero; everything else is a bug and keeps
its traceback."""


class UserError(Exception):
    """A problem the user can fix; the message says what happened and what to do."""


def user_error_types() -> tuple[type[Exception], ...]:
    """UserError and the FTW format's own FTWError (ftw never imports engine): the exceptions whose
    message is all a user needs. Imported lazily so that this module stays free of torch."""
    from ftw import FTWError
    return UserError, FTWError
