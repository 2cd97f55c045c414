"""The option is the config field (issue 50 item 4): a config group's field carries its option
(:class:`pleharness.option.Opt`: help, bounds, panel), the command line makes the option of it,
so that the option's default is the field's and its help the field's; ``--scenario``'s help
lists the default suite as :data:`pleharness.config.DEFAULT_SCENARIOS` holds it."""
import ast
import dataclasses
from pathlib import Path

import pytest
import typer

import pleharness
from pleharness import config
from pleharness.cli import app, options
from pleharness.engine.inflight import Timeouts
from pleharness.option import Opt, options_of

CONFIG_GROUPS = (config.EngineConfig, config.AttachConfig, config.SuiteConfig,
                 config.ReferenceConfig, config.ControlConfig, config.VerdictConfig, Timeouts,
                 config.OutputConfig, config.ConfirmationConfig)


def params(command: str) -> dict:
    """{option name: click parameter} of ``ple-harness COMMAND``."""
    return {p.name: p for p in typer.main.get_command(app).commands[command].params}


def annotated():
    """Every option-carrying field of the config groups of StressConfig."""
    return [src for cls in CONFIG_GROUPS for src in options_of(cls).values()]


def test_the_annotated_fields_are_the_ones_expected():
    """A guard on the table below: the fields whose option the config declares."""
    names = {(src.cls.__name__, src.field) for src in annotated()}
    assert names == {
        ("EngineConfig", "probe"), ("SuiteConfig", "logprobs"),
        ("ReferenceConfig", "engine_args"), ("ReferenceConfig", "drop_args"),
        ("ReferenceConfig", "cache_state"), ("ReferenceConfig", "golden_model"),
        ("VerdictConfig", "near_tie_nats"), ("VerdictConfig", "strict"),
        ("VerdictConfig", "numerics_from"), ("VerdictConfig", "golden"),
        ("VerdictConfig", "on_timeout"), ("Timeouts", "connect_s"),
        ("Timeouts", "first_token_s"), ("Timeouts", "between_tokens_s"), ("Timeouts", "total_s"),
        ("OutputConfig", "results_dir"), ("OutputConfig", "run_id"),
        ("ConfirmationConfig", "runs"), ("ConfirmationConfig", "parallel_engines"),
        ("ControlConfig", "engine_args"), ("ControlConfig", "drop_args"),
        ("ControlConfig", "profile"), ("ControlConfig", "python")}


@pytest.mark.parametrize("src", annotated(), ids=lambda s: f"{s.cls.__name__}.{s.field}")
def test_stress_option_is_its_config_field(src):
    """Each annotated field is an option of stress: named as the Opt says, its default the
    field's (parsed as the builders parse it), its help, panel and bounds the field's Opt."""
    opt: Opt = src.opt
    p = params("stress")[src.name]
    assert src.value(p.default) == src.default
    assert p.help == opt.help
    assert p.rich_help_panel == opt.panel
    assert (p.min, p.max) == (opt.min, opt.max)
    assert p.envvar == opt.envvar
    assert p.opts == ["--" + src.name.replace("_", "-")]


def test_fuzz_confirmation_options_are_the_config_fields_with_fuzz_help():
    """fuzz takes ConfirmationConfig's options in its own panel, --confirm-runs with its own help
    (what a fuzz run replays); the defaults and bounds stay the field's."""
    fields = options_of(config.ConfirmationConfig)
    fuzz = params("fuzz")
    for src in fields.values():
        assert src.value(fuzz[src.name].default) == src.default
        assert (fuzz[src.name].min, fuzz[src.name].max) == (src.opt.min, src.opt.max)
        assert fuzz[src.name].rich_help_panel == "Search budget and reproducibility"
    assert fuzz["parallel_engines"].help == fields["parallel_engines"].opt.help
    assert "repro-larger.toml" in fuzz["confirm_runs"].help
    assert fuzz["confirm_runs"].help != fields["runs"].opt.help


def test_a_group_built_from_the_options_defaults_is_the_config_default():
    """config_values of the option groups at their defaults build the config groups' defaults."""
    for cls, groups in ((config.VerdictConfig, (options.VerdictOptions(),
                                                options.GoldenProbeOptions(),
                                                options.TimeoutOptions())),
                        (Timeouts, (options.TimeoutOptions(),)),
                        (config.OutputConfig, (options.OutputOptions(),)),
                        (config.ConfirmationConfig, (options.ReferenceOptions(),)),
                        (config.ReferenceConfig, (options.ReferenceOptions(),)),
                        (config.ControlConfig, (options.ControlOptions(),))):
        values = options.config_values(cls, *groups)
        assert set(values) == set(options_of(cls)), cls
        assert cls(**values) == cls(), cls


def test_control_options_are_the_control_config_fields(tmp_path):
    """The four --control-* options fill ControlConfig's fields through config_values: the lists
    as given, --control-profile found and checked (its path), --control-engine-python kept."""
    from pleharness.cli.assemble import control_group
    prof = tmp_path / "ctl.toml"
    prof.write_text('engine_args = ["--enforce-eager"]\n')
    got = control_group(options.ControlOptions(
        control_engine_arg=["--enforce-eager"], control_drop_arg=["--speculative-config"],
        control_profile=prof, control_engine_python=None), warn=print)
    assert got == config.ControlConfig(engine_args=["--enforce-eager"],
                                       drop_args=["--speculative-config"], profile=str(prof))
    assert not control_group(options.ControlOptions(), warn=print)


def test_config_options_refuses_a_field_without_an_option():
    with pytest.raises(TypeError, match="invocation"):
        options.config_options(config.OutputConfig, "invocation")
    with pytest.raises(TypeError, match="nope"):
        options.config_options(config.OutputConfig, help={"nope": "x"})


def test_scenario_help_lists_exactly_the_default_scenarios():
    """Issue 50: --scenario's help listed 9 defaults while DEFAULT_SCENARIOS had 12; it is made
    of the list."""
    help_ = params("stress")["scenario"].help
    listed = help_.split("Default: ", 1)[1].rstrip(".").split(", ")
    assert listed == list(config.DEFAULT_SCENARIOS)


def test_the_config_floor_imports_no_command_line():
    """The options are plain data: config.py, option.py and the Timeouts' module import neither
    typer nor click nor anything of pleharness.cli."""
    root = Path(pleharness.__file__).parent
    for rel in ("config.py", "option.py", "engine/inflight.py"):
        tree = ast.parse((root / rel).read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [("." * n.level) + (n.module or "") for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom)]
        bad = [x for x in names if x.split(".")[0] in ("typer", "click")
               or x.lstrip(".").startswith("cli") or x.startswith("pleharness.cli")]
        assert bad == [], (rel, bad)


def test_every_option_group_field_of_stress_is_an_option_of_it():
    """The generated groups are option groups like the written ones (grouped expands them)."""
    stress = params("stress")
    for group in (options.VerdictOptions, options.GoldenProbeOptions, options.TimeoutOptions,
                  options.OutputOptions, options.ReferenceOptions):
        assert group.option_group
        for f in dataclasses.fields(group):
            assert f.name in stress and f.name in group.sources, (group.__name__, f.name)
