"""ple-harness: validation and stress-test harness for patched vLLM inference engines."""

__version__ = "0.1.0"

# the command's start, for every job's time stamps (pleharness.timeline.COMMAND_STARTED)
from . import timeline  # noqa: E402,F401
