"""Errors the engine's command reports to its user, importable without loading the engine."""


class GraphChanged(RuntimeError):
    """The graph's checkpoint was made for other views: starting it would skip history."""
