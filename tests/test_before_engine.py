"""Issue 36 item 1: bad input is refused before any engine is reached. Each input of the table
runs against a listening socket that counts connections (an engine would be there): the exit is 2
with the message that names the problem, and the socket saw 0 connections."""
import socket
import threading

import pytest

from conftest import run_cli

SCENARIOS = {
    "sampled_nan": ('kind = "sampled"\ndescription = "x"\n[params]\ntemperature = nan\n',
                    "params.temperature: Input should be a finite number"),
    "sampled_seeded_no_probe": ('kind = "sampled"\ndescription = "x"\n[params]\nseeded = 8\n'
                                'seed_probe_pairs = 0\n', "seeded = 8 needs the seed probe"),
    "stop_past_count": ('kind = "stop_strings"\ndescription = "x"\n[params]\ncount_to = 40\n'
                        'min_position = 50\nmax_tokens = 100\n',
                        "min_position (50) must be <= count_to (40)"),
    "mixed_twice": ('kind = "mixed_params"\ndescription = "x"\n[[params.variants]]\nname = "a"\n'
                    'repetition_penalty = 1.5\n[[params.variants]]\nname = "a"\n'
                    'presence_penalty = 1.0\n', "variant names must be distinct: a"),
    "mixed_nothing": ('kind = "mixed_params"\ndescription = "x"\n[[params.variants]]\n'
                      'name = "same"\n', "variant 'same' changes nothing"),
    "disc_abandon": ('kind = "disconnects"\ndescription = "x"\n[params]\nmax_tokens = 8\n'
                     'abandon_after_tokens = 8\n', "abandon_after_tokens (8) must be < max_tokens"),
    "replay_regex": ('kind = "replay"\ndescription = "x"\n[[params.phases]]\nname = "p"\n'
                     'concurrency = 1\n[[params.phases.requests]]\nprompt = [1, 2]\n'
                     'max_tokens = 4\nchecks = { expected_text = { regex = "([" } }\n',
                     "not a regular expression"),
    "replay_failed_phase": ('kind = "replay"\ndescription = "x"\n[[params.phases]]\nname = "p"\n'
                            'concurrency = 1\n[[params.phases.requests]]\nprompt = [1, 2]\n'
                            'max_tokens = 4\n[[params.failed]]\nphase = "q"\n',
                            "failed: phase q is not one of the phases (p)"),
    "replay_conc": ('kind = "replay"\ndescription = "x"\n[[params.phases]]\nname = "p"\n'
                    'concurrency = 5\n[[params.phases.requests]]\nprompt = [1, 2]\n'
                    'max_tokens = 4\n', "concurrency 5 with 1 request(s)"),
    "huge_ladder": ('kind = "transitions"\ndescription = "x"\n[params]\nladder = [1024, 1024]\n'
                    'requests_per_slot = 10000\nrepeats = 10000\n',
                    "this ladder plans 204,800,000,000 load requests"),
}


@pytest.fixture(scope="module")
def listener():
    """A socket where an engine would listen; ``count[0]``: connections accepted."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    count = [0]

    def accept():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            count[0] += 1
            c.close()
    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{s.getsockname()[1]}", count
    s.close()


def _options(tmp_path):
    (tmp_path / "file").write_text("x")
    return [
        (("stress", "--near-tie-nats", "nan"), "--near-tie-nats 'nan': not a finite number"),
        (("fuzz", "--time-budget", "inf"), "--time-budget 'inf': not a finite number"),
        (("fuzz", "--shrink-budget", "inf"), "--shrink-budget 'inf': not a finite number"),
        (("fuzz", "--db", str(tmp_path / "file" / "db")), "is not a folder"),
        (("fuzz", "--db", "/proc/ple-db"), "is not writable"),
        (("selftest", "--fault", "oov_id", "--fault", "oov_id"),
         "--fault oov_id: given more than once"),
        (("selftest", "--suite", ""), "--suite '': an empty value"),
        (("stress", "--scenario", str(tmp_path)), "a folder, not a file (scenario expected)"),
        (("stress", "--control-engine-arg=--enforce-eager", "--control-engine-arg=--enforce-eager"),
         "--control-engine-arg --enforce-eager: given more than once"),
        (("stress", "--confirm-runs", "5", "--scenario", "boundary"),
         "--confirm-runs 5: no selected scenario writes a reproducer (only the fuzz kind does: "
         "add --scenario fuzz"),
    ]


def test_bad_scenario_files_never_reach_the_engine(listener, tmp_path):
    url, count = listener
    for name, (text, want) in SCENARIOS.items():
        f = tmp_path / f"{name}.toml"
        f.write_text(text)
        r = run_cli("stress", "--url", url, "--scenario", str(f), "--results-dir",
                    str(tmp_path / "res"), timeout=120)
        assert r.returncode == 2 and want in r.stderr, (name, r.stderr)
        c = run_cli("scenarios", "--check", str(f), timeout=60)  # the same pass, no engine
        assert c.returncode == 2 and want in c.stderr, (name, c.stderr)
    assert count[0] == 0, "a bad scenario file reached the engine"
    assert not (tmp_path / "res").exists()


def test_bad_options_never_reach_the_engine(listener, tmp_path):
    url, count = listener
    for args, want in _options(tmp_path):
        r = run_cli(*args, "--url", url, timeout=120)
        assert r.returncode == 2 and want in r.stderr, (args, r.stderr)
    assert count[0] == 0, "a bad option reached the engine"


def test_a_url_with_a_query_is_refused(listener):
    url, count = listener
    r = run_cli("stress", "--url", url + "/?token=abc-SECRET", timeout=60)
    assert r.returncode == 2 and "has no query or fragment" in r.stderr, r.stderr
    assert "SECRET" not in r.stderr and count[0] == 0


def test_scenarios_check_passes_the_shipped_files():
    r = run_cli("scenarios", "--check", "boundary", "--check", "sampled", "--check", "nightly",
                timeout=60)
    assert r.returncode == 0, r.stderr
    assert "boundary: ok (boundary)" in r.stdout and "nightly: ok (suite of" in r.stdout
