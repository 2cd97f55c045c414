"""The test suite's own helpers in conftest.py: the smaller variants of shipped scenarios the
engine tests run (issue 49)."""
import tomllib
from pathlib import Path

import pytest

from conftest import scenario_variant


def test_scenario_variant_replaces_params_and_refuses_an_unknown_key(tmp_path):
    path = Path(scenario_variant(tmp_path, "transitions", repeats=1, ladder=[2, 1]))
    data = tomllib.loads(path.read_text())
    assert (data["params"]["repeats"], data["params"]["ladder"]) == (1, [2, 1])
    assert path == tmp_path / "transitions.toml"
    with pytest.raises(KeyError):
        scenario_variant(tmp_path, "transitions", no_such_param=3)
