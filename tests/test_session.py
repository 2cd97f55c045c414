"""The engine session (pleharness/engine/session.py): variants of a launch, signals, the kill list,
and explain's typed report. No engine: the process the session kills is a plain ``sleep`` group,
the report is built by hand; the engine paths run in test_e2e_lifecycle, test_failures and
test_attribution."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from rich.console import Console

from conftest import group_alive
from pleharness.engine.launch import EngineServer, LaunchSpec
from pleharness.engine.session import EngineSession, Interrupted, Target, Variant
from pleharness.errors import HarnessError

ARGS = ["--max-num-seqs", "8", "--speculative-config", "{}", "--dtype=float32"]


def quiet() -> Console:
    return Console(file=io.StringIO())


def target() -> Target:
    return Target(url=None, model_path="/m", served_name="tiny", python="py", engine_args=ARGS,
                  engine_env={"A": "1"})


def test_variant_drops_adds_and_keeps_the_rest_of_the_launch():
    v = Variant.of(drop=["--speculative_config"], add=["--enforce-eager"], env={"B": "2"})
    assert v.apply(ARGS, {"A": "1"}) == (["--max-num-seqs", "8", "--dtype=float32",
                                          "--enforce-eager"], {"A": "1", "B": "2"})
    spec = v.spec(target())
    assert spec.engine_args == ["--max-num-seqs", "8", "--dtype=float32", "--enforce-eager"]
    assert (spec.model, spec.python, spec.served_model_name, spec.port) == ("/m", "py", "tiny",
                                                                            None)
    assert spec.env["A"] == "1" and spec.env["B"] == "2"
    # a control profile: its own arguments replace the engine's, --control-engine-arg after them
    prof = Variant.of(add=["--enforce-eager"], base=["--block-size", "16"])
    assert prof.apply(ARGS, {})[0] == ["--block-size", "16", "--enforce-eager"]


def test_a_suspect_and_a_control_are_the_same_variant():
    from pleharness.explain import Suspect
    from pleharness.config import ControlConfig, StressConfig
    from pleharness.second_engine import control_variant
    sus = Suspect("speculative decoding", "", drop=["--speculative-config"],
                  add=["--enforce-eager"])
    cfg = StressConfig(control=ControlConfig(drop_args=["--speculative-config"],
                                             engine_args=["--enforce-eager"]))
    assert sus.variant == control_variant(cfg)
    assert "variant" not in sus.__dict__  # explain.json's suspects stay as they were


def test_a_signal_in_a_session_raises_interrupted_and_the_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as exc:
        with EngineSession(quiet(), Path(".")) as session:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs between bytecodes; never reached
    assert isinstance(exc.value, HarnessError) and exc.value.exit_code == 143
    assert str(exc.value) == "interrupted by SIGTERM" and session.signalled == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is before
    assert Interrupted(signal.SIGINT).exit_code == 130


def listed_group(session: EngineSession, tmp_path: Path) -> EngineServer:
    """A process group in the session's kill list, as a launched engine is (a plain sleep: no
    engine is needed to test the kill)."""
    srv = EngineServer(LaunchSpec(model="/m", python="py"), tmp_path)
    srv.proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    session.servers.append(srv)
    return srv


def test_a_second_signal_kills_the_engines_running_now(tmp_path):
    with EngineSession(quiet(), tmp_path) as session:
        srv = listed_group(session, tmp_path)
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        assert group_alive(srv.proc.pid)  # the first signal only interrupts
        os.kill(os.getpid(), signal.SIGINT)  # the second: SIGKILL now, no exception
        srv.proc.wait(timeout=10)
        assert srv.proc.returncode == -signal.SIGKILL and session.grace_s() == 0
        session.servers.clear()


def test_the_session_stops_its_engines_on_every_exit_path(tmp_path):
    with pytest.raises(RuntimeError):
        with EngineSession(quiet(), tmp_path, signals=False) as session:
            srv = listed_group(session, tmp_path)
            session._stack.callback(lambda: session._stop(srv) if srv in session.servers
                                    else None)
            raise RuntimeError("a harness error mid-run")
    assert not group_alive(srv.proc.pid) and session.servers == []


def test_explain_report_json_keeps_its_shape():
    from pleharness.explain import ExplainReport, Suspect
    from pleharness.manifest.explain import CaseReport
    from pleharness.manifest.tables import Confirmation
    from pleharness.render.explain import to_junit, to_markdown
    empty = ExplainReport("r1", 3, 60.0)
    assert list(json.loads(empty.to_json())) == ["run_id", "status", "tries", "budget_s",
                                                 "estimate", "side_by_side", "golden", "cases",
                                                 "suspects", "launches"]
    case = CaseReport(case=1, prompt_hash="abc", concurrency=4, phase="C4", requests=["r2-0"],
                      first_divergence=5, prompt_len=7, minimal_case="alone",
                      baseline={"alone": {"fails": True, "tries": 1, "divergent": [
                          {"first_divergence": 5}]}},
                      controls={"prefix caching": {"fails": True, "vanishes": False,
                                                   "divergent": []}},
                      narrowing={"interaction": None, "numeric": []},
                      attribution="persists in every control", repro="explain/repro-1.toml")
    rep = ExplainReport("r1", 3, 60.0, [case], [Suspect("prefix caching", "on")],
                        [{"config": "under test", "command": ["py"], "ready_s": 1.0}], 2.5)
    d = rep.to_dict()
    assert list(d) == ["run_id", "status", "tries", "budget_s", "estimate", "side_by_side",
                       "golden", "cases", "suspects", "launches", "elapsed_s"]
    assert "reproduction" not in d["cases"][0] and d["suspects"][0]["name"] == "prefix caching"
    case.reproduction = Confirmation(runs=2, reproduced=2, errors=0, inconclusive=0,
                                     fresh_engine=True, rate="2/2", verdict="reproduced 2/2",
                                     side_by_side=1, replays=[])
    case.reproduction_verdict = "reproduced 2/2"
    assert list(rep.to_dict()["cases"][0])[-3:] == ["repro", "reproduction",
                                                    "reproduction_verdict"]
    md = to_markdown(rep.result())
    assert "| 1 | C4 | 4 | 7 | r2-0 | alone | persists | `explain/repro-1.toml` |" in md
    assert "- case 1: `explain/repro-1.toml` reproduced 2/2" in md
    assert 'message="persists in every control"' in to_junit(rep.result())


def test_stopping_an_engine_closes_its_client(tmp_path):
    """explain stops each suspect's engine as soon as its replays end; its client (connection
    pool, event loop) is closed with it, not left for the garbage collector (which had aiohttp
    print "Unclosed client session" in explain's console). An attached engine is left alone."""
    from types import SimpleNamespace

    from pleharness.engine.client import EngineClient
    from pleharness.engine.session import Engine
    with EngineSession(quiet(), tmp_path, signals=False) as session:
        srv = listed_group(session, tmp_path)
        client = EngineClient("http://127.0.0.1:9", "m")
        _ = client.loop  # starts its event-loop thread
        assert client._lt is not None
        session.stop(Engine(client, srv, None, {}, None))
        assert client._lt is None and not group_alive(srv.proc.pid)
        attached = SimpleNamespace(close=lambda: pytest.fail("an attached client was closed"))
        session.stop(Engine(attached, None, None, {}, None))
