"""pleharness.cli.assemble (issue 50 item 4, the option is the config field): the builders read
the typed option groups, every option of ``stress`` reaches its config (none silently
ignored), and no option value is read back by a string key."""
import ast
import dataclasses
import sys
from pathlib import Path

import pytest

from pleharness.cli import assemble, options
from pleharness.cli.assemble import ATTACH_FACTS, LAUNCH_ONLY, option_problems, stress_config
from pleharness.cli.options import Api
from pleharness.defaults import DEFAULT_REFERENCE

GROUPS = {"engine": options.EngineOptions, "attach": options.AttachOptions,
          "scen": options.ScenarioOptions, "control": options.ControlOptions,
          "golden": options.GoldenProbeOptions, "ref": options.ReferenceOptions,
          "verdict": options.VerdictOptions, "timeouts": options.TimeoutOptions,
          "output": options.OutputOptions}

# (stress_config argument, option field) -> a valid value other than the option's default
CHANGED = {
    ("engine", "model"): "/models/m", ("engine", "engine_profile"): Path("cpu-ngram"),
    ("engine", "tp"): 2, ("engine", "engine_python"): "/opt/vllm/bin/python",
    ("engine", "engine_arg"): ["--max-num-seqs=8"], ("engine", "engine_env"): ["A=1"],
    ("engine", "host"): "0.0.0.0", ("engine", "port"): 8123, ("engine", "start_timeout"): 30.0,
    ("engine", "compile_cache"): "COMPILE_CACHE",
    ("attach", "url"): "http://127.0.0.1:9", ("attach", "block_size"): 16,
    ("attach", "chunk_size"): 256, ("attach", "num_speculative_tokens"): 3,
    ("attach", "max_num_seqs"): 4, ("attach", "max_model_len"): 1024,
    ("attach", "vocab_size"): 100, ("attach", "dtype"): "float16",
    ("attach", "served_model_name"): "served", ("attach", "api_key_env"): "ASSEMBLE_TEST_KEY",
    ("scen", "scenario"): ["boundary"], ("scen", "suite"): "selftest", ("scen", "ladder"): "4,1",
    ("scen", "repeats"): 2, ("scen", "max_tokens"): 5, ("scen", "suite_repeats"): 3,
    ("scen", "repeat_old"): 2, ("scen", "api"): Api.chat,
    ("control", "control_engine_arg"): ["--enforce-eager"],
    ("control", "control_drop_arg"): ["--enable-prefix-caching"],
    ("control", "control_engine_python"): sys.executable,
    ("control", "control_profile"): Path("cpu-ngram"),
    ("golden", "golden"): False, ("golden", "engine_probe"): False,
    ("ref", "confirm_runs"): 1, ("ref", "parallel_engines"): "2",
    ("ref", "golden_model"): "/models/g", ("ref", "reference_engine_arg"): ["--enforce-eager"],
    ("ref", "reference_drop_arg"): ["--enable-prefix-caching"],
    ("ref", "reference_cache_state"): "cold", ("ref", "logprobs"): 5,
    ("verdict", "near_tie_nats"): 0.3, ("verdict", "strict"): True,
    ("verdict", "numerics_from"): "self",
    ("timeouts", "connect_timeout"): 1.0, ("timeouts", "first_token_timeout"): 2.0,
    ("timeouts", "between_tokens_timeout"): 3.0, ("timeouts", "request_timeout"): 4.0,
    ("timeouts", "on_timeout"): "abort",
    ("output", "results_dir"): "elsewhere", ("output", "run_id"): "run-1",
}


def build(**changed):
    """stress_config of the default groups, ``changed`` ({arg: group instance or value})
    replacing some."""
    kw = {arg: cls() for arg, cls in GROUPS.items()}
    return stress_config(**{**kw, "reference": DEFAULT_REFERENCE, "warn": lambda _: None,
                            **changed})


def test_the_table_names_every_option_of_every_group_of_stress():
    fields = {(arg, f.name) for arg, cls in GROUPS.items() for f in dataclasses.fields(cls)}
    assert set(CHANGED) == fields
    for (arg, name), value in CHANGED.items():
        assert getattr(GROUPS[arg](), name) != value, (arg, name)


@pytest.mark.parametrize("arg,name", sorted(CHANGED))
def test_every_option_of_stress_changes_the_config(arg, name, monkeypatch, tmp_path):
    """An option the builders do not read (a field added to a group and forgotten, or read under
    another name) leaves the config as it was: this fails for it."""
    monkeypatch.setenv("ASSEMBLE_TEST_KEY", "key-1")
    monkeypatch.setattr("sys.argv", ["ple-harness", "stress"])
    value = CHANGED[arg, name]
    if value == "COMPILE_CACHE":
        value = str(tmp_path / "cc")
    group = dataclasses.replace(GROUPS[arg](), **{name: value})
    assert build(**{arg: group}) != build()


def test_reference_changes_the_config(monkeypatch):
    monkeypatch.setattr("sys.argv", ["ple-harness", "stress"])
    assert build(reference="golden").reference.source == "golden" != build().reference.source


def test_option_tables_name_fields_of_the_option_groups():
    """A typo in LAUNCH_ONLY or ATTACH_FACTS would never match a given option (silently no
    check), and ATTACH_FACTS' names are read as AttachOptions attributes."""
    all_fields = {f.name for cls in GROUPS.values() for f in dataclasses.fields(cls)}
    assert {name for name, _ in LAUNCH_ONLY} <= all_fields
    attach = {f.name for f in dataclasses.fields(options.AttachOptions)}
    assert {name for name, *_ in ATTACH_FACTS} <= attach
    for name, flag, *_ in (*LAUNCH_ONLY, *ATTACH_FACTS):
        assert flag == "--" + name.replace("_", "-")


def test_launch_options_with_url_are_named_and_a_missing_group_checks_nothing():
    url = options.AttachOptions(url="http://127.0.0.1:9")
    out = option_problems(options.EngineOptions(), url, given={"tp", "control_profile"},
                          results_dir="results")
    assert out == ["--tp, --control-profile: launch option(s), but --url attaches to a running "
                   "engine that the harness does not start (drop them, or drop --url)"]
    assert option_problems(options.EngineOptions(), options.AttachOptions(), given=(),
                           results_dir="results") == []


def test_assemble_reads_no_option_value_by_a_string_key():
    """No ``o["name"]`` / ``o.get("name")`` in the builders: an option is an attribute of its
    group (a typo is an AttributeError, not a silent None)."""
    tree = ast.parse(Path(assemble.__file__).read_text())
    keyed = [n.lineno for n in ast.walk(tree)
             if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load)
             and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str)]
    gets = [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == "get" and n.args and isinstance(n.args[0], ast.Constant)
            and not (isinstance(n.func.value, ast.Name) and n.func.value.id == "env")]
    assert keyed == [] and gets == [], (keyed, gets)
    assert not hasattr(options, "values")


def test_a_numerics_from_run_that_measured_nothing_is_refused_before_the_run(tmp_path):
    """--numerics-from is read when the options are: a run with no measured envelope, or a
    file that is no manifest, is a usage error then (it used to be found after the suite and the
    control ran, and the run's own judgement was lost)."""
    import json

    from pleharness.errors import UsageError
    from pleharness.manifest import Manifest
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "manifest.json").write_text(json.dumps(Manifest(run_id="p").model_dump(mode="json")))
    toml = tmp_path / "p.toml"
    toml.write_text("a = 1\n")
    for src, msg in ((plain, "measured no numerics envelope"), (toml, "--numerics-from")):
        with pytest.raises(UsageError, match=msg):
            assemble.verdict_group(options.VerdictOptions(numerics_from=str(src)),
                                   options.GoldenProbeOptions(), options.TimeoutOptions())
    measured = tmp_path / "measured"
    measured.mkdir()
    m = Manifest(run_id="m")
    m.run_options.numerics_envelope = {"measured": {"logprob_nats": 0.4}}
    (measured / "manifest.json").write_text(json.dumps(m.model_dump(mode="json")))
    v = assemble.verdict_group(options.VerdictOptions(numerics_from=str(measured)),
                               options.GoldenProbeOptions(), options.TimeoutOptions())
    assert v.numerics_from == str(measured)
