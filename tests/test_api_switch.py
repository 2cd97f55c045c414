"""Issue 35 item 1, ``--api completions|chat|both``: load requests whose prompt is exactly the
chat template of a message (the stop_strings and insert counting prompts) also go (both) or
only go (chat) to /v1/chat/completions, compared with the same completions reference; token-ID
prompts stay on /v1/completions. Option parsing without an engine; the rest on the real CPU
engine (session fixture ``cpu_engine``, attached with ``--url``)."""
from dataclasses import replace

import pytest

import clean_scenarios
from conftest import NO_GOLDEN, default_stress_options, load_json, run_cli
from doubles import FaultProxy
from pleharness.cli import assemble
from pleharness.cli.assemble import stress_config
from pleharness.cli.options import Api, ScenarioOptions
from pleharness.config import AttachConfig, EngineConfig, StressConfig, SuiteConfig
from pleharness.errors import UsageError
from pleharness.faults.families import ChatFlipUnderLoad
from pleharness.manifest import Manifest
from pleharness.prompts import Prompt
from pleharness.request import RequestSpec
from pleharness.run import api

FACTS = ["--block-size", "32", "--chunk-size", "256", "--num-speculative-tokens", "3"]
CHAT = Prompt("count", (1, 2, 3), text="Count", messages=(("user", "Count"),))
RAW = Prompt("raw", (4, 5))


# -- without an engine --------------------------------------------------------------------------
def test_bad_api_value_is_a_usage_error_naming_the_option():
    r = run_cli("stress", "--api", "chatty", "--url", "http://127.0.0.1:9")
    assert r.returncode == 2
    assert "--api" in r.stderr and "'chatty' is not one of" in r.stderr, r.stderr
    with pytest.raises(UsageError, match="--api 'x': expected completions, chat or both"):
        StressConfig(suite=SuiteConfig(api="x")).validate()


def test_api_option_is_in_stress_help_and_defaults_to_both():
    r = run_cli("stress", "--help")
    assert r.returncode == 0 and "--api" in r.stdout
    assert "chat twin" in r.stdout
    assert ScenarioOptions().api.value == "both"
    groups = (EngineConfig(), AttachConfig(url="http://127.0.0.1:9"))
    real = assemble.engine_groups
    assemble.engine_groups = lambda engine, attach, probe: groups
    try:
        assert stress_config(**default_stress_options()).suite.api == "both"
        chat = ScenarioOptions(api=Api.chat)
        chat.given = frozenset({"api"})
        assert stress_config(**default_stress_options(scen=chat)).suite.api == "chat"
    finally:
        assemble.engine_groups = real
    assert StressConfig().suite.api == "completions"  # fuzz, selftest, replays: as before


def test_plan_routes_only_prompts_with_a_message_form():
    stop = RequestSpec(CHAT, 8, stop=("7",))
    specs = [stop, replace(stop, stream=False), RequestSpec(RAW, 8),
             RequestSpec(CHAT, 8, abandon_after_tokens=2)]
    p = api.plan(specs, "completions", load=True)
    assert p.send == specs and not p.route and p.counts["chat"] == 0
    both = api.plan(specs, "both", load=True)
    # one twin for the streamed and the non-streamed copy of one request (same reference)
    assert both.send[:4] == specs and both.twins == 1 and not both.route
    (twin,) = both.send[4:]
    assert twin.messages == CHAT.messages and twin.stream and twin.stop == ("7",)
    assert twin.ref_key == stop.ref_key
    assert both.counts == {"completions": 4, "chat": 1, "chat_twins": 1, "no_chat_form": 1,
                           "not_chat_shaped": 1}
    chat = api.plan(specs, "chat", load=True)
    assert chat.send == specs and set(chat.route) == {id(specs[0]), id(specs[1])}
    assert chat.counts["chat"] == 2 and chat.counts["completions"] == 2
    # references and batched-prompt phases stay on completions
    assert api.plan(specs, "both", load=False).twins == 0
    assert api.plan(specs, "chat", load=True, batched=True).route == {}
    with pytest.raises(ValueError, match="one of completions, chat, both"):
        api.plan(specs, "grpc", load=True)


def test_a_model_without_a_chat_template_falls_back_to_completions():
    from pleharness.errors import EngineError

    class NoTemplate:
        def tokenize(self, **kw):
            assert kw["messages"] and kw["add_generation_prompt"]
            raise EngineError("/tokenize answered 400: no chat template")

    class Template:
        def tokenize(self, **kw):
            return [1, 2, 3]
    got = api.resolve("both", NoTemplate())
    assert got["api_used"] == "completions" and got["chat_template"] is False
    assert "no chat template" in got["api_note"] and "--api both" in got["api_note"]
    assert api.resolve("chat", Template()) == {"api": "chat", "api_used": "chat",
                                               "chat_template": True}
    assert api.resolve("completions", NoTemplate()) == {"api": "completions",
                                                       "api_used": "completions"}


def test_summary_line_says_the_api_mode():
    from pleharness.causes import headline
    m = Manifest(run_id="x")
    assert "api" not in headline(m)
    m.run_options.assign(api="both", api_used="both", chat_template=True)
    m.summary.api_paths = {"stop_strings": {"chat": 3, "chat_twins": 3, "no_chat_form": 0},
                           "transitions": {"chat": 0, "chat_twins": 0, "no_chat_form": 80}}
    assert "; api both: 3 chat request(s) (3 twins), 80 token-ID prompt(s) completions only" \
        in headline(m)
    # a run with no message-form prompt says nothing of the api on its line (the manifest does)
    m.summary.api_paths = {"transitions": {"chat": 0, "chat_twins": 0, "no_chat_form": 80}}
    assert "api" not in headline(m)
    m.run_options.assign(api="chat", api_used="chat")
    assert "; api chat: 0 chat request(s), 80 token-ID prompt(s) completions only" in headline(m)
    m.run_options.assign(api="both", api_used="completions", chat_template=False)
    assert "; api both -> completions (no chat template)" in headline(m)


# -- on the real CPU engine ---------------------------------------------------------------------
def stress(url, tmp_path, run_id, *args):
    r = run_cli("stress", "--url", url, "--results-dir", str(tmp_path), "--run-id", run_id,
                "--no-engine-probe", *FACTS, *args)
    return r, r.stdout + r.stderr, load_json(tmp_path / run_id / "manifest.json")


def short_insert(tmp_path):
    path = tmp_path / "insert.toml"
    path.write_text('kind = "insert"\n[params]\ncount_to = 30\ndecode_tokens = 60\n'
                    'max_inserts = 2\n')
    return str(path)


@pytest.mark.engine
@pytest.mark.nightly  # default (issue 49): test_e2e_cpu.py::test_stress_default_suite_launch
# asserts clean_scenarios.chat_twins on the default suite's run
def test_api_both_sends_chat_twins_that_match_their_references(cpu_engine, tmp_path):
    r, out, m = stress(cpu_engine.url, tmp_path, "both", "--api", "both", "--scenario",
                       "stop_strings", "--scenario", short_insert(tmp_path))
    assert r.returncode == 0 and m["verdict"] == "pass", out[-3000:]
    clean_scenarios.chat_twins(m, out)


@pytest.mark.engine
def test_api_completions_sends_no_chat_request(cpu_engine, tmp_path):
    r, out, m = stress(cpu_engine.url, tmp_path, "comp", "--api", "completions", "--scenario",
                       "stop_strings")
    assert r.returncode == 0, out[-3000:]
    assert m["run_options"]["api"] == "completions" and "chat_template" not in m["run_options"]
    assert not [q for q in m["requests"] if q.get("api") == "chat"]
    assert m["summary"]["api_paths"]["stop_strings"]["chat"] == 0
    assert "api " not in m["summary"]["headline"]


@pytest.mark.engine
def test_api_chat_sends_message_prompts_only_to_the_chat_endpoint(cpu_engine, tmp_path):
    r, out, m = stress(cpu_engine.url, tmp_path, "chat", "--api", "chat", "--scenario",
                       "stop_strings")
    assert r.returncode == 0 and m["verdict"] == "pass", out[-3000:]
    load = {p["name"] for p in m["phases"] if p["role"] == "load"}
    loads = [q for q in m["requests"] if q["phase"] in load]
    assert loads and all(q.get("api") == "chat" and q["match"] is True for q in loads)
    refs = [q for q in m["requests"] if q["phase"] not in load]
    assert refs and not any(q.get("api") == "chat" for q in refs)
    assert m["summary"]["api_paths"]["stop_strings"]["chat_twins"] == 0


@pytest.mark.engine
def test_a_chat_only_defect_fails_the_chat_twins_by_parity(cpu_engine, tmp_path):
    """A double that changes output position 5 of every chat answer (completions untouched):
    under --api both the run fails, naming only chat twins of the stop_strings phases, by
    parity; the completions requests still match. (At any load: with the selftest's "2 or more
    in flight", a fresh clone saw the load phase's chat twins each arrive alone, and the fault
    never fired.)"""
    fault = ChatFlipUnderLoad(min_in_flight=1)
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress(proxy.url, tmp_path, "flip", NO_GOLDEN, "--api", "both",
                           "--scenario", "stop_strings")
    assert fault.hits
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    bad = [q for q in m["requests"] if q["match"] is False]
    assert bad and all(q["api"] == "chat" and q["phase"] in ("stop-plain-solo", "stop-c8")
                       for q in bad)
    assert len(bad) == len(set(fault.hits))  # every chat answer it changed, and no other
    assert all(q["first_divergence"] == 5 for q in bad)
    assert all(any(c["name"] == "parity" and c["status"] == "fail" for c in q["checks"])
               for q in bad)
    assert all(q["match"] is not False for q in m["requests"] if q.get("api") != "chat")
