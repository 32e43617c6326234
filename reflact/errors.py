"""The one exception type for user mistakes (bad config, bad input files).

The entry point turns it into a one-line message and exit code 2; anything else is a bug
and keeps its traceback.
"""


class UserError(Exception):
    """A mistake the user can fix; the message names the key, file or line at fault."""
