"""Errors a user can cause and fix: bad input files, bad arguments, unusable stores.

The command line prints these as one line without a traceback (unless ``--debug``);
anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input or arguments, explained in the message."""


class InputError(UserError, ValueError):
    """Bad input data: names the file, line or entry at fault. Also a ValueError, the
    exception Python and scikit-learn conventions expect for a bad value."""


class StoreError(UserError):
    """A dataset or run store that is missing, partial, corrupt or of the wrong kind."""
