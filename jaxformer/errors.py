"""The one base class of the errors a user can fix: the message says what is wrong and how to
go on. The command line prints such an error as one line (no traceback)."""


class JaxformerError(Exception):
  """Bad input, settings, data or checkpoints, or a run that cannot go on; see the message."""
