"""pleharness.jobrun: what a run names as its independent reference, and --reference
manifest:PATH's errors (the module's mirror; the job itself runs in the engine tests)."""
import json

import pytest

from pleharness.config import ControlConfig, ReferenceConfig, StressConfig
from pleharness.errors import UsageError
from pleharness.jobrun import independent_reference, load_reference_manifest
from pleharness.manifest import Manifest


@pytest.mark.parametrize("source, python, control, named", [
    ("solo", None, False, None),  # every reference is this configuration's own
    ("solo", None, True, "control run"),
    ("solo", "/base/bin/python", True, "control run on another build (/base/bin/python)"),
    ("engine", None, False, "reference engine"),
    ("golden", None, True, "control run, golden model references"),
    ("manifest:/runs/a/manifest.json", None, False,
     "stored references (manifest:/runs/a/manifest.json)"),
])
def test_the_independent_reference_is_named_or_none(source, python, control, named):
    cfg = StressConfig(reference=ReferenceConfig(source=source),
                       control=ControlConfig(python=python))
    ctl = Manifest(run_id="ctl") if control else None
    assert independent_reference(cfg, ctl) == named


def test_a_reference_manifest_that_is_not_one_or_holds_none_is_a_usage_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    with pytest.raises(UsageError, match=f"--reference manifest:{bad}"):
        load_reference_manifest(f"manifest:{bad}")
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps(Manifest(run_id="e").model_dump(mode="json")))
    with pytest.raises(UsageError, match="holds no references"):
        load_reference_manifest(f"manifest:{empty}")
