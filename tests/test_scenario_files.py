from pathlib import Path

import pytest

from conftest import run_cli

from pleharness.errors import UsageError
from pleharness.prompts import pad_chat_prompt, seeded_prompts
from pleharness.scenarios import ScenarioError, load_scenario_file, load_scenarios


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "s.toml"
    p.write_text(text)
    return str(p)


def test_shipped_transitions_defaults():
    sc = load_scenario_file("transitions")
    assert sc.kind == "transitions"
    assert sc.params.ladder == [4, 3, 2, 1, 2, 3, 4, 1]
    assert sc.params.repeats == 2
    assert sc.planned_phases() == 16


def test_cli_overrides_apply():
    (sc,) = load_scenarios(["transitions"], {"ladder": [2, 1], "repeats": 3, "max_tokens": 8})
    assert sc.params.ladder == [2, 1]
    assert sc.planned_phases() == 6
    assert sc.params.max_tokens == 8


def test_override_for_no_scenario_is_an_error():
    with pytest.raises(UsageError, match="apply to none"):
        load_scenarios(["transitions"], {"no_such_key": 1})


def test_toml_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, 'kind = "transitions"\n[params]\nrepeats = = 2\nladder = [1]\n')
    with pytest.raises(ScenarioError) as e:
        load_scenario_file(path)
    assert str(e.value).startswith(f"{path}: TOML syntax error")
    assert "line 3" in str(e.value)


@pytest.mark.parametrize("body,message", [
    ("ladder = []", "params.ladder: Value error, the ladder must have at least one concurrency level"),
    ("ladder = [4, 0, 1]", "params.ladder: Value error, concurrency levels must be between 1 "
                           "and 1024 (got 0)"),
    ("ladder = [100000000000]", "params.ladder: Value error, concurrency levels must be between "
                                "1 and 1024 (got 100000000000)"),
    ("ladder = 'four'", "params.ladder: Input should be a valid list"),
    ("repeats = 0", "params.repeats: Input should be greater than or equal to 1"),
    ("laddr = [1]", "params.laddr: unknown key (allowed: ladder, repeats, requests_per_slot, "
                    "max_tokens, warmup_requests, prompts, max_tokens_residues, sampled_every, "
                    "temperature, sampled_seed, sampled_prompt_len, sampled_with_spec_decode, "
                    "alternate_stream, identical_copies)"),
    ("[params.prompts]\nmin_len = 10\nmax_len = 5",
     "params.prompts: Value error, min_len (10) must be <= max_len (5)"),
])
def test_invalid_params_name_the_key(tmp_path, body, message):
    path = write(tmp_path, f'kind = "transitions"\n[params]\n{body}\n')
    with pytest.raises(ScenarioError) as e:
        load_scenario_file(path)
    assert str(e.value) == f"{path}: {message}"


def test_unknown_kind_and_top_level_key(tmp_path):
    path = write(tmp_path, 'kind = "nope"\n')
    with pytest.raises(ScenarioError, match="kind 'nope' is not a known scenario kind"):
        load_scenario_file(path)
    path = write(tmp_path, 'kind = "transitions"\nladder = [1]\n')
    with pytest.raises(ScenarioError, match="unknown top-level key"):
        load_scenario_file(path)


def test_prompts_are_fitted_to_the_engine_not_refused(tmp_path):
    """Issue 48: transitions' prompts are shortened to fit max_model_len (with the q - 1
    residues), IDs kept below the vocabulary; each change is said, none is an error."""
    p = load_scenario_file("transitions").params.prompts
    fit, notes = p.fitted({"max_model_len": 256, "vocab_size": 1000}, 32 + 3)
    assert fit == (5, 221, 16, 1000)
    assert notes == ["prompt lengths 5..300 shortened to 5..221: + 35 output tokens must fit "
                     "max_model_len 256"]
    assert p.fitted({"max_model_len": 4096, "vocab_size": 1000}, 35) == ((5, 300, 16, 1000), [])
    assert p.fitted({"max_model_len": 4096}, 35) == (
        (5, 300, 16, 256), ["vocabulary size unknown: prompt IDs drawn below 256"])
    fit, notes = p.fitted({"max_model_len": 30}, 35)
    assert fit is None and notes[-1] == ("no prompt fits: 35 output tokens leave no room in "
                                         "max_model_len 30")


def test_seeded_prompts_are_reproducible_and_spread():
    a = seeded_prompts(7, 4, 5, 20, 16, 100)
    b = seeded_prompts(7, 4, 5, 20, 16, 100)
    assert [p.ids for p in a] == [p.ids for p in b]
    assert [len(p) for p in a] == [5, 10, 15, 20]
    assert all(16 <= t < 100 for p in a for t in p.ids)
    assert seeded_prompts(8, 4, 5, 20, 16, 100)[0].ids != a[0].ids


def test_pad_chat_prompt():
    tpl = [0, 2, 10, 11, 12, 4, 9, 3, 9]
    out = pad_chat_prompt(tpl, 99, 12, tail=4)
    assert out == [0, 2, 10, 11, 12, 99, 99, 99, 4, 9, 3, 9]
    assert pad_chat_prompt(tpl, 99, len(tpl)) == tpl
    with pytest.raises(ValueError, match="shorter than the unpadded prompt"):
        pad_chat_prompt(tpl, 99, 5)


class StubTokenizer:
    """Answers /tokenize like the engine would, for the prompt builder."""

    def __init__(self, filler_ids):
        self.filler_ids = filler_ids

    def tokenize(self, **payload):
        if "messages" in payload:
            return [0, 2, 10, 11, 12, 4, 9, 3, 9]
        return list(self.filler_ids)


def test_chat_prompt_builder_exact_length_and_filler_errors():
    from pleharness.prompts import ChatPromptBuilder
    b = ChatPromptBuilder(StubTokenizer([7]), filler=" ", tail=4)
    p = b.build("Reply with OK.", 12, why="test")
    assert list(p.ids) == [0, 2, 10, 11, 12, 7, 7, 7, 4, 9, 3, 9] and len(p) == 12
    with pytest.raises(ValueError, match="shorter than the unpadded prompt"):
        b.build("Reply with OK.", 8)
    with pytest.raises(ValueError) as e:
        ChatPromptBuilder(StubTokenizer([7, 8]), filler="ab")
    assert str(e.value) == ("filler string 'ab' is 2 tokens ([7, 8]), not exactly one; "
                            "choose another filler")


@pytest.mark.parametrize("kind,body,message", [
    ("boundary", "expected_regex = '(['", "params.expected_regex: Value error, not a valid "
                                          "regular expression"),
    ("boundary", "filler = ''", "params.filler: String should have at least 1 character"),
    ("boundary", "tail = 500", "params.tail: Input should be less than or equal to 64"),
    ("pairs", "extra_pairs = [[1]]", "params.extra_pairs.0"),
    ("boundary", "extra_lengths = [-5]", "params.extra_lengths.0: Input should be greater than"),
    ("determinism", "n = 100000", "params.n: Input should be less than or equal to 1024"),
])
def test_more_invalid_params(tmp_path, kind, body, message):
    path = write(tmp_path, f'kind = "{kind}"\n[params]\n{body}\n')
    with pytest.raises(ScenarioError) as e:
        load_scenario_file(path)
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value)


def test_max_tokens_beyond_max_model_len_leaves_the_phases_out_before_requests():
    """Issue 48: what cannot fit this engine is left out with its reason, no request sent."""
    from pleharness.run.dryrun import plan_scenario
    plan = plan_scenario(load_scenario_file("boundary", {"max_tokens": 5000}),
                         {"max_model_len": 4096})
    assert plan.error is None and plan.requests == 0
    assert [(ph.name, ph.status) for ph in plan.load] == [
        ("boundary-cold", "left out"), ("boundary-warm", "left out"),
        ("boundary-repeat", "left out"), ("max-model-len-edges", "left out")]
    assert {ph.vacuous for ph in plan.load} == {
        "params.max_tokens 5000 leaves no room for a prompt: max_model_len is 4096"}
    det = plan_scenario(load_scenario_file("determinism", {"prompt_len": 5000}),
                        {"max_model_len": 4096})
    assert det.error is None and det.load[0].prompt_lens == (4064, 4064)
    assert det.notes == ["determinism_notes: prompt shortened to 4064 tokens (params.prompt_len "
                         "5000 + max_tokens 32 exceeds max_model_len 4096)"]


@pytest.mark.parametrize("what,body,key", [
    ("scenario", 'kind = "transitions"\n[params]\nrepeats = "2"\n', "params.repeats"),
    ("suite", 'repeat = "3"\n[[scenario]]\nname = "transitions"\n', "repeat"),
    ("profile", 'tp = "2"\n', "tp"),
])
def test_values_are_not_coerced(tmp_path, what, body, key):
    """Strict input: a string where a number belongs is an error naming the file and the key."""
    f = tmp_path / f"bad-{what}.toml"
    f.write_text(body)
    flag = {"scenario": "--scenario", "suite": "--suite", "profile": "--engine-profile"}[what]
    attach = [] if what == "profile" else ["--url", "http://127.0.0.1:9"]  # a profile launches
    r = run_cli("stress", flag, str(f), *attach, "--results-dir", str(tmp_path), timeout=60)
    out = "".join((r.stdout + r.stderr).split())  # the console may wrap long lines
    assert r.returncode == 2, out
    assert str(f) in out and f"{key}:Inputshouldbeavalidinteger" in out


# -- suites: errors name the suite file, the entry and the scenario; a scenario once per suite ----
def _suite(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "my-suite.toml"
    p.write_text(body)
    return p


def test_suite_entry_errors_name_the_suite_file_entry_and_key(tmp_path):
    from pleharness.suites import load_suite
    p = _suite(tmp_path, '[[scenario]]\nname = "transitions"\n[[scenario]]\nname = "pairs"\n'
                         'params = { max_tokens = "8" }\n')
    with pytest.raises(UsageError) as e:
        load_suite(str(p))
    msg = str(e.value)
    assert msg.startswith(f"{p}: scenario[1] ('pairs'): ") and "params.max_tokens" in msg
    p = _suite(tmp_path, '[[scenario]]\nname = "no-such-scenario"\n')
    with pytest.raises(UsageError, match=r"my-suite.toml: scenario\[0\] \('no-such-scenario'\): "
                                         r"unknown scenario 'no-such-scenario'"):
        load_suite(str(p))
    # the CLI: exit 2, the same message, nothing started
    r = run_cli("stress", "--suite", str(p), "--results-dir", str(tmp_path / "runs"), timeout=60)
    assert r.returncode == 2 and f"{p}: scenario[0] ('no-such-scenario')" in r.stderr
    assert not (tmp_path / "runs").exists()


def test_same_scenario_twice_is_a_clear_error(tmp_path):
    from pleharness.suites import load_suite
    p = _suite(tmp_path, '[[scenario]]\nname = "transitions"\n[[scenario]]\nname = "pairs"\n'
                         '[[scenario]]\nname = "transitions"\nparams = { repeats = 1 }\n')
    with pytest.raises(UsageError, match=r"my-suite.toml: scenario\[2\] \('transitions'\) is "
                                         r"scenario 'transitions' again \(as scenario\[0\]\)"):
        load_suite(str(p))
    with pytest.raises(UsageError, match="transitions selected more than once"):
        load_scenarios(["transitions", "pairs", "transitions"], {})
    r = run_cli("stress", "--scenario", "pairs", "--scenario", "pairs", "--results-dir",
                str(tmp_path / "runs"), timeout=60)
    assert r.returncode == 2 and "pairs selected more than once" in r.stderr
    assert not (tmp_path / "runs").exists()


def test_control_profile_checked_before_the_run_and_ignored_keys_warned(tmp_path):
    bad = tmp_path / "bad-control.toml"
    bad.write_text('engine_args = ["--enforce-eager"]\ntp = "2"\n')
    r = run_cli("stress", "--control-profile", str(bad), "--results-dir", str(tmp_path / "runs"),
                timeout=60)
    assert r.returncode == 2 and str(bad) in r.stderr and "tp" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()
    named = tmp_path / "named-control.toml"
    named.write_text('model = "/models/x"\npython = "/usr/bin/python3"\n'
                     'engine_args = ["--enforce-eager"]\n')
    # a later usage error stops the run before anything starts; the warning came first
    r = run_cli("stress", "--control-profile", str(named), "--scenario", "nope",
                "--results-dir", str(tmp_path / "runs"), timeout=60)
    assert r.returncode == 2 and "unknown scenario 'nope'" in r.stderr
    assert f"--control-profile {named}: model, python ignored" in " ".join(r.stderr.split())


def test_what_the_engine_cannot_fit_is_left_out_not_a_usage_error(tmp_path):
    """Issue 48: max_tokens against max_model_len needs the engine's max_model_len (the double:
    4096); once the engine is up that is no usage error: every pair phase is left out, vacuous,
    with the reason, and the run completes."""
    import json
    from doubles import FakeEngine
    with FakeEngine() as eng:
        r = run_cli("stress", "--url", eng.url, "--scenario", "pairs", "--max-tokens", "5000",
                    "--vocab-size", "600", "--results-dir", str(tmp_path), "--run-id", "late",
                    timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    m = json.loads((tmp_path / "late" / "manifest.json").read_text())
    assert m["status"] == "complete" and m["exit_code"] == 0 and m["verdict"] == "pass"
    s = m["summary"]
    assert s["phases_planned"] == s["phases_left_out"] == 4 and s["phases_completed"] == 0
    assert [p["status"] for p in m["phases"]] == ["skip"] * 4
    why = "params.max_tokens 5000 leaves no room for a prompt: max_model_len is 4096"
    assert s["vacuous"] == [f"phase pair{i}: {why}" for i in range(1, 5)]
    assert "4 left out on this engine, vacuous" in s["headline"]