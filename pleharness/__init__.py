"""ple-harness: validation and stress-test harness for patched vLLM inference engines."""

__version__ = "0.1.0"
