"""pleharness.engine.fact_sources: the launch's --max-model-len against the model's declared
length, as vLLM derives it (GPU run w: a model of 4096 positions served at 20480 died with a
device-side assert)."""
import json
import sys

import pytest

from pleharness.engine.fact_sources import (long_len_allowed, model_position_limit,
                                            parse_token_count, positions_warning)
from pleharness.engine.session import resolve_target


def model(tmp_path, cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


@pytest.mark.parametrize("text, n", [("4096", 4096), ("32k", 32000), ("32K", 32768),
                                     ("1.5k", 1500), ("1T", 2**40), ("-1", None),
                                     ("auto", None), ("1.5K", None), ("100.7", None),
                                     ("1e3", None), ("0", None), (True, None)])
def test_max_model_len_values_read_as_vllm_reads_them(text, n):
    assert parse_token_count(text) == n


@pytest.mark.parametrize("cfg, limit", [
    ({"max_position_embeddings": 4096}, 4096),
    # the smallest length key wins; model_max_length wins when set
    ({"max_position_embeddings": 1024, "seq_length": 64}, 64),
    ({"max_position_embeddings": 64, "model_max_length": 128}, 128),
    # factors of linear / dynamic scaling multiply, below 1 too; yarn's and llama3's are
    # already in the declared length (vLLM 0.32)
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2}}, 8192),
    ({"max_position_embeddings": 64, "rope_parameters": {"rope_type": "dynamic",
                                                         "factor": 0.5}}, 32),
    ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                        "original_max_position_embeddings": 1024}},
     4096),
    ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8}},
     131072),
    ({"model_type": "gemma3", "max_position_embeddings": 1000,
      "rope_scaling": {"rope_type": "linear", "factor": 8}}, 1000),
    ({"text_config": {"max_position_embeddings": 512}}, 512),
    ({"text_config": [1, 2], "max_position_embeddings": 256}, 256),
    ({"vocab_size": 10}, None),
    ([1, 2, 3], None),
])
def test_the_models_length_as_vllm_derives_it(tmp_path, cfg, limit):
    got = model_position_limit(model(tmp_path, cfg))
    assert (got[0] if got else None) == limit


def test_no_config_is_no_limit(tmp_path):
    assert model_position_limit(str(tmp_path / "nowhere")) is None
    (tmp_path / "config.json").write_text("{not json")
    assert model_position_limit(str(tmp_path)) is None


def test_a_max_model_len_beyond_the_models_positions_is_warned(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    m = model(tmp_path, {"max_position_embeddings": 4096})
    w = positions_warning(m, ["--max-model-len", "20480"], {})
    assert "20480" in w and "max_position_embeddings 4096" in w and "refuses" in w
    w = positions_warning(m, ["--max_model_len=20k"], {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert "20000" in w and "outside the model's positions" in w
    # vLLM reads only 1 and true
    assert "refuses" in positions_warning(m, ["--max-model-len=8192"],
                                          {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "false"})
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "True")  # the launch inherits it
    assert long_len_allowed({}) and not long_len_allowed({"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "0"})
    assert "will start" in positions_warning(m, ["--max-model-len=8192"], {})
    assert positions_warning(m, ["--max-model-len", "4096"], {}) is None
    assert positions_warning(m, ["--max-model-len", "8192", "--max-model-len", "2048"], {}) is None
    assert positions_warning(m, [], {}) is None
    # --hf-overrides may change the config: nothing to say
    assert positions_warning(m, ["--max-model-len=8192", '--hf-overrides={"max_position_'
                                 'embeddings": 9000}'], {}) is None


def test_the_warning_comes_before_the_launch_and_an_odd_config_never_crashes_it(tmp_path):
    m = model(tmp_path, {"max_position_embeddings": 64})
    said = []
    t = resolve_target(url=None, model=m, python=sys.executable,
                       engine_args=["--max-model-len", "128"], log=said.append)
    assert t.model_path == m and len(said) == 1 and "--max-model-len 128" in said[0]
    (tmp_path / "config.json").write_text("[1, 2, 3]")
    said.clear()
    resolve_target(url=None, model=m, python=sys.executable,
                   engine_args=["--max-model-len", "128"], log=said.append)
    assert said == []


def test_the_warning_is_kept_in_the_runs_manifest_and_summary(tmp_path, monkeypatch):
    """A run that could not start its engine (here: the start raises, as vLLM's refusal would)
    still says why the launch was doubtful, in manifest.json and summary.md."""
    import io
    import shutil

    from rich.console import Console

    from pleharness.config import EngineConfig, OutputConfig, StressConfig, SuiteConfig
    from pleharness.engine.session import EngineSession
    from pleharness.errors import EngineError
    from pleharness.model import ensure_embedded_model
    from pleharness.pipeline import run_stress

    m = tmp_path / "model"
    shutil.copytree(ensure_embedded_model(sys.executable), m)
    cfg = json.loads((m / "config.json").read_text())
    (m / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 64}))

    def refused(self, *a, **kw):
        raise EngineError("engine exited during startup (exit 1)",
                          root_cause="ValueError: max_model_len 128 > derived 64")
    monkeypatch.setattr(EngineSession, "start", refused)
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    quiet = Console(file=io.StringIO(), width=200)
    code = run_stress(StressConfig(
        engine=EngineConfig(model=str(m), python=sys.executable,
                            args=["--max-model-len", "128"]),
        suite=SuiteConfig(scenarios=["transitions"]),
        output=OutputConfig(results_dir=tmp_path / "runs", run_id="r", invocation=["x"])),
        quiet, quiet)
    assert code == 3
    run = tmp_path / "runs" / "r"
    (w,) = json.loads((run / "manifest.json").read_text())["engine"]["launch_warnings"]
    assert "--max-model-len 128 is beyond the model's max_position_embeddings 64" in w
    assert w in (run / "summary.md").read_text()


def test_a_control_or_reference_engine_past_the_positions_is_warned_too(tmp_path, monkeypatch):
    """The control's own --max-model-len (a helper's attack: no warning before) and the
    reference engine's; one equal to the engine under test's is not said twice; attached:
    nothing to launch."""
    from pleharness.config import (AttachConfig, ControlConfig, EngineConfig, ReferenceConfig,
                                   StressConfig)
    from pleharness.second_engine import with_second_engine_warnings
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    m = model(tmp_path, {"max_position_embeddings": 64})
    t = resolve_target(url=None, model=m, python=sys.executable,
                       engine_args=["--max-model-len", "32"], log=lambda x: None)
    assert t.warnings == ()
    cfg = StressConfig(engine=EngineConfig(model=m, python=sys.executable),
                       control=ControlConfig(engine_args=["--max-model-len", "128"]))
    (w,) = with_second_engine_warnings(cfg, t).warnings
    assert w.startswith("control engine: warning: --max-model-len 128 is beyond")
    cfg = StressConfig(engine=EngineConfig(model=m, python=sys.executable),
                       reference=ReferenceConfig(source="engine",
                                                 engine_args=["--max-model-len=100"]))
    (w,) = with_second_engine_warnings(cfg, t).warnings
    assert w.startswith("reference engine: warning: --max-model-len 100")
    # the engine under test's own warning is not repeated for a control that keeps its length
    t2 = resolve_target(url=None, model=m, python=sys.executable,
                        engine_args=["--max-model-len", "128"], log=lambda x: None)
    cfg = StressConfig(engine=EngineConfig(model=m, python=sys.executable),
                       control=ControlConfig(engine_args=["--enforce-eager"]))
    assert with_second_engine_warnings(cfg, t2).warnings == t2.warnings
    cfg = StressConfig(attach=AttachConfig(url="http://127.0.0.1:1"),
                       control=ControlConfig(engine_args=["--max-model-len", "128"]))
    assert with_second_engine_warnings(cfg, t) is t
