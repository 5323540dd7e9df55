class StackError(RuntimeError):
    """A local service or setup step failed; the message says what to do about it."""
