"""Defaults that the command line and the configuration it builds share: one value, one place
(issue 34 item 2). Imports nothing, so the CLI's option declarations can read it cheaply.

Each constant is the default of one option and of the config group field it fills
(:mod:`pleharness.config`); ``tests/test_cli_discipline.py`` holds ``stress``'s option defaults
and the groups' defaults together."""

DEFAULT_CONFIRM_RUNS = 3
"""Replays of each reproducer, each on a freshly started engine (``--confirm-runs`` of stress,
fuzz and explain; :attr:`pleharness.config.ConfirmationConfig.runs`)."""

DEFAULT_SHRINK_BUDGET_S = 60.0
"""Seconds of shrinking after fuzz's first failure (``fuzz --shrink-budget``; the fuzz
scenario's ``shrink_budget_s``). Measured on an H200 (docs/gpu-runs/2026-12-06-v-issue47-49): a
fault that shows only with >= 2 requests in flight failed first after 12 s of search; within 30 s
of shrinking hypothesis had a 7-request schedule, and the 270 s after that (600 s was the budget,
hypothesis stops itself at 300 s) found nothing smaller that failed on its recheck, while the
confirmed reproducer waited: a minute bounds the wait for a reproducer (issue 49)."""

DEFAULT_PARALLEL_ENGINES = 1
"""Engines started side by side (``--parallel-engines``, whose option value is a string: a
number or auto; :attr:`pleharness.config.ConfirmationConfig.parallel_engines`)."""

DEFAULT_START_TIMEOUT_S = 900.0
"""Seconds to wait for a launched engine to become ready (``--start-timeout`` of stress, fuzz,
selftest, facts and explain; :attr:`pleharness.config.EngineConfig.start_timeout_s`)."""

DEFAULT_HOST = "127.0.0.1"
"""Listen address of a launched engine (``--host``; :attr:`pleharness.config.EngineConfig.host`)."""

DEFAULT_ENGINE_PROBE = True
"""Measure the engine first (``--engine-probe``; :attr:`pleharness.config.EngineConfig.probe`)."""

DEFAULT_LOGPROBS = 2
"""Top-k logprobs per output token (``--logprobs``;
:attr:`pleharness.config.SuiteConfig.logprobs`)."""

DEFAULT_SUITE_REPEATS = 1
"""Suite passes on one engine (``--suite-repeats``;
:attr:`pleharness.config.SuiteConfig.repeat`)."""

DEFAULT_API = "both"
"""``stress --api``: completions requests with a message form also go to /v1/chat/completions
(the commands without ``--api`` send completions: :attr:`pleharness.config.SuiteConfig.api`)."""

DEFAULT_REFERENCE = "solo"
"""Where single-request references come from (``--reference``;
:attr:`pleharness.config.ReferenceConfig.source`)."""

DEFAULT_REFERENCE_CACHE_STATE = "warm"
"""Which run of a reference prompt is kept (``--reference-cache-state``;
:attr:`pleharness.config.ReferenceConfig.cache_state`)."""

DEFAULT_GOLDEN = True
"""Classify divergences with the golden model (``--golden``;
:attr:`pleharness.config.VerdictConfig.golden`)."""

DEFAULT_STRICT = False
"""Any divergence fails (``--strict``; :attr:`pleharness.config.VerdictConfig.strict`)."""

DEFAULT_ON_TIMEOUT = "continue"
"""After a phase with timed-out requests (``--on-timeout``;
:attr:`pleharness.config.VerdictConfig.on_timeout`)."""

DEFAULT_CONNECT_TIMEOUT_S = 10.0
"""Seconds to connect (``--connect-timeout``; :class:`pleharness.engine.inflight.Timeouts`)."""

DEFAULT_FIRST_TOKEN_TIMEOUT_S = 300.0
"""Seconds from sending a request to its first token (``--first-token-timeout``)."""

DEFAULT_BETWEEN_TOKENS_TIMEOUT_S = 120.0
"""Longest gap between two streamed tokens, seconds (``--between-tokens-timeout``)."""

DEFAULT_REQUEST_TIMEOUT_S = 1800.0
"""Longest whole request, seconds (``--request-timeout`` of stress; fuzz has its own, 600)."""

DEFAULT_RESULTS_DIR = "results"
"""Where run folders are created (``--results-dir``;
:attr:`pleharness.config.OutputConfig.results_dir`)."""


def confirm_runs_help(what: str, extra: str = "") -> str:
    """The ``--confirm-runs`` help text of a command that replays ``what``."""
    return (f"Replay {what} this many times, each on a freshly started engine of the "
            f"configuration under test, and report the reproduction rate ('reproduced "
            f"{DEFAULT_CONFIRM_RUNS}/{DEFAULT_CONFIRM_RUNS}').{extra} 0: skip.")
