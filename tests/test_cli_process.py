"""The tests' ``ple-harness`` calls run forked from a server that imported the CLI once
(tests/cli_process.py); what a call returns must be what a fresh interpreter returns."""
import os
import socket
import subprocess
import time

import pytest

from cli_process import run_forked, run_spawned
from conftest import ROOT, cli_env


def _env(**extra: str) -> dict[str, str]:
    return cli_env(extra)


@pytest.mark.parametrize("args, env", [
    (["--help"], {}),
    (["stress", "--bogus-option"], {}),  # click's usage error names the program: python -m pleharness
    (["stress", "--url", "http://127.0.0.1:9", "--api-key-env", "PLE_TEST_KEY"],
     {"PLE_TEST_KEY": ""}),  # read from the call's environment when the command runs
    (["report", "no-such-run-dir"], {}),  # a path relative to the call's working directory
])
def test_a_forked_call_answers_as_a_fresh_interpreter(args, env):
    forked = run_forked(args, _env(**env), ROOT, timeout=120)
    spawned = run_spawned(args, _env(**env), ROOT, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == \
        (spawned.returncode, spawned.stdout, spawned.stderr)
    assert forked.stdout or forked.stderr  # something was compared


def test_each_call_has_its_own_environment():
    """Two calls in a row with different environments: neither sees the other's, and the test
    process's own is left as it was."""
    a = run_forked(["stress", "--url", "http://127.0.0.1:9", "--api-key-env", "PLE_TEST_KEY"],
                   _env(PLE_TEST_KEY=""), ROOT, timeout=120)
    b = run_forked(["stress", "--url", "http://127.0.0.1:9", "--api-key-env", "PLE_TEST_KEY"],
                   _env(), ROOT, timeout=120)
    assert a.returncode == b.returncode == 2
    assert "empty" in a.stderr and "not set" in b.stderr
    assert "PLE_TEST_KEY" not in os.environ


def test_a_call_past_its_timeout_is_killed_and_raises():
    """subprocess.run's contract: TimeoutExpired once the child is killed. The engine here
    accepts connections and never answers, so the call cannot end by itself within the limit."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            run_forked(["stress", "--url", url, "--scenario", "boundary"], _env(), ROOT, timeout=3)
        assert time.monotonic() - t0 < 60
