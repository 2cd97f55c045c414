"""Former home of the console renderer; kept so that existing imports keep working.

Use :mod:`pleharness.render` (``render``, ``causes``, ``next_steps``, ``headline``,
``verdict_line``) instead.
"""
from .render.console import render  # noqa: F401
from .render.text import (_failing_divergence, _where, causes, headline,  # noqa: F401
                          next_steps, verdict_line)
