"""Renderers of a run's manifest, one module per output: :mod:`.console` (rich, the terminal),
:mod:`.markdown` (``summary.md``), :mod:`.junit` (``junit.xml``), :mod:`.text` (the next steps
and reproduce command they share), :mod:`.compare` (``ple-harness compare``), :mod:`.facts`
(``ple-harness facts``), :mod:`.explain` (``ple-harness explain``) and :mod:`.probe` (``ple-harness
probe``). The headline and causes they quote: :mod:`pleharness.causes`."""
from .console import render
from .junit import to_junit
from .markdown import to_markdown
from .text import engaged_lines, next_steps, reproduce_command, verdict_line

__all__ = ["engaged_lines", "next_steps", "render", "reproduce_command", "to_junit",
           "to_markdown", "verdict_line"]
