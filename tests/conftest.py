import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, timeout: float = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``ple-harness ARGS`` with this interpreter; output captured as text. The engine probe
    (pleharness/engine_probe.py) is off unless a test passes ``--engine-probe`` (or sets
    PLE_HARNESS_ENGINE_PROBE): its solo requests would shift the request numbers and prompt
    occurrences that the engine doubles pick their faults by."""
    return subprocess.run([sys.executable, "-m", "pleharness", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PLE_HARNESS_ENGINE_PROBE": "0", **(env or {}),
                               "COLUMNS": "200"})


def load_json(path: Path) -> dict:
    """A manifest file as a dict; from schema version 2 on, its request records are read from
    the JSON Lines file it names (``requests_file``, first ``requests_count`` lines) into
    ``requests``, as schema version 1 held them inline."""
    path = Path(path)
    data = json.loads(path.read_text())
    if isinstance(data, dict) and "requests" not in data and data.get("requests_file"):
        lines = (path.parent / data["requests_file"]).read_text().splitlines()
        data["requests"] = [json.loads(x) for x in lines[:data["requests_count"]]]
    return data


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def launched_pid(run_dir: Path) -> int | None:
    for line in (run_dir / "launcher.log").read_text().splitlines():
        if line.startswith("pid "):
            return int(line.split()[1].rstrip(";"))
    return None


@pytest.fixture(scope="session")
def embedded_model() -> Path:
    from pleharness.model import ensure_embedded_model
    return ensure_embedded_model(sys.executable)


@pytest.fixture(scope="session")
def cpu_engine(embedded_model, tmp_path_factory):
    """The real CPU vLLM engine serving the embedded model with profiles/cpu-ngram.toml (started
    once per test session)."""
    from pleharness.engine.launch import EngineServer, LaunchSpec
    from pleharness.model import SERVED_NAME
    from pleharness.profile import load_profile

    prof = load_profile(ROOT / "profiles" / "cpu-ngram.toml")
    spec = LaunchSpec(model=str(embedded_model), python=sys.executable,
                      engine_args=prof.engine_args, env=prof.env, served_model_name=SERVED_NAME)
    srv = EngineServer(spec, tmp_path_factory.mktemp("cpu-engine"), start_timeout_s=600)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
