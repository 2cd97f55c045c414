"""Former home of the Markdown / JUnit renderers and the throughput summary; kept so that existing
imports keep working.

Use :mod:`pleharness.render` (``to_markdown``, ``to_junit``, ``reproduce_command``) and
:mod:`pleharness.summary` (``throughput_by_concurrency``) instead.
"""
from .render.junit import to_junit  # noqa: F401
from .render.markdown import to_markdown  # noqa: F401
from .render.text import reproduce_command  # noqa: F401
from .summary import throughput_by_concurrency  # noqa: F401
