"""pleharness.engine.fact_sources: the launch's --max-model-len against the model's positions
(GPU run w: a model of 4096 positions served at 20480 died with a device-side assert)."""
import json
import sys

import pytest

from pleharness.engine.fact_sources import (model_position_limit, parse_token_count,
                                            positions_warning)
from pleharness.engine.session import resolve_target


def model(tmp_path, **cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


@pytest.mark.parametrize("text, n", [("4096", 4096), ("32k", 32000), ("32K", 32768),
                                     ("1.5k", 1500), ("-1", None), ("auto", None), (True, None)])
def test_max_model_len_values_read_as_vllm_reads_them(text, n):
    assert parse_token_count(text) == n


def test_the_models_positions_with_and_without_rope_scaling(tmp_path):
    assert model_position_limit(model(tmp_path, max_position_embeddings=4096))[0] == 4096
    assert model_position_limit(model(tmp_path, max_position_embeddings=4096, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}))[0] == 8192
    assert model_position_limit(model(tmp_path, max_position_embeddings=4096, rope_scaling={
        "type": "linear", "factor": 2}))[0] == 8192
    # llama3's factor is already in max_position_embeddings
    assert model_position_limit(model(tmp_path, max_position_embeddings=131072, rope_scaling={
        "rope_type": "llama3", "factor": 8.0}))[0] == 131072
    assert model_position_limit(model(tmp_path, text_config={"max_position_embeddings": 512}))[0] \
        == 512
    assert model_position_limit(model(tmp_path, vocab_size=10)) is None
    assert model_position_limit(str(tmp_path / "nowhere")) is None


def test_a_max_model_len_beyond_the_models_positions_is_warned(tmp_path):
    m = model(tmp_path, max_position_embeddings=4096)
    w = positions_warning(m, ["--max-model-len", "20480"], {})
    assert "20480" in w and "max_position_embeddings 4096" in w and "refuses" in w
    w = positions_warning(m, ["--max_model_len=20k"], {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert "20000" in w and "outside the model's positions" in w
    assert positions_warning(m, ["--max-model-len", "4096"], {}) is None
    assert positions_warning(m, ["--max-model-len", "8192", "--max-model-len", "2048"], {}) is None
    assert positions_warning(m, [], {}) is None


def test_the_warning_comes_before_the_launch(tmp_path):
    m = model(tmp_path, max_position_embeddings=64)
    said = []
    t = resolve_target(url=None, model=m, python=sys.executable,
                       engine_args=["--max-model-len", "128"], log=said.append)
    assert t.model_path == m and len(said) == 1 and "--max-model-len 128" in said[0]
