"""Compatibility alias: the errors live in :mod:`pleharness.errors` (the package top), since
modules outside the engine layer raise them too."""
from ..errors import (EXIT_ENGINE, EXIT_FAIL, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE,  # noqa: F401
                      EngineError, HarnessError, UsageError, write_crash_log)
