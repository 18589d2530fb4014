"""SweepError, in a module of its own so that grid.py and backend.py can both raise it without
importing each other in a cycle (grid.py reaches experiments/ only through backend.py)."""


class SweepError(ValueError):
    """Bad sweep input; the message is one line meant for the user."""
