"""Defaults that the command line and the configuration it builds share: one value, one place
(issue 34 item 2). Imports nothing, so the CLI's option declarations can read it cheaply."""

DEFAULT_CONFIRM_RUNS = 3
"""Replays of each reproducer, each on a freshly started engine (``--confirm-runs`` of stress,
fuzz and explain; :attr:`pleharness.config.StressConfig.confirm_runs`)."""


def confirm_runs_help(what: str, extra: str = "") -> str:
    """The ``--confirm-runs`` help text of a command that replays ``what``."""
    return (f"Replay {what} this many times, each on a freshly started engine of the "
            f"configuration under test, and report the reproduction rate ('reproduced "
            f"{DEFAULT_CONFIRM_RUNS}/{DEFAULT_CONFIRM_RUNS}').{extra} 0: skip.")
