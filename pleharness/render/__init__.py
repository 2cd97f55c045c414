"""Renderers of a run's manifest, one module per output: :mod:`.console` (rich, the terminal),
:mod:`.markdown` (``summary.md``), :mod:`.junit` (``junit.xml``), and :mod:`.text` (the headline,
causes, next steps and reproduce command they share)."""
from .console import render
from .junit import to_junit
from .markdown import to_markdown
from .text import causes, engaged_lines, headline, next_steps, reproduce_command, verdict_line

__all__ = ["causes", "engaged_lines", "headline", "next_steps", "render", "reproduce_command", "to_junit",
           "to_markdown", "verdict_line"]
