"""pleharness.engine.spares: a spare is handed over only for a launch equal to its own, once,
only when its start succeeded and it is still alive; every spare not taken is stopped when the
pool closes; a session adopts a spare instead of launching (its start record says so). The
engine processes are replaced by a stand-in EngineServer lifecycle (start / alive / stop): what
is tested is the pool's bookkeeping, the real launches are the engine test
tests/test_fuzz.py::test_engine_fuzz_repro_confirmed_on_fresh_engines."""
import threading
from pathlib import Path

import pytest
from rich.console import Console

from pleharness.engine import launch
from pleharness.engine.launch import Cancelled, LaunchSpec, cancel_threads
from pleharness.engine.session import EngineSession, Target
from pleharness.engine.spares import SpareEngines
from pleharness.errors import EngineError


@pytest.fixture
def servers(monkeypatch):
    """EngineServer.start / alive / stop without a process: a start fails when the spec's
    model is 'bad'; ``gate`` holds starts until set; the names of the stopped ones."""
    state = {"stopped": [], "started": [], "gate": threading.Event(), "dead": set()}
    state["gate"].set()

    def start(self):
        state["gate"].wait(10)
        state["started"].append(self.log_dir.name)
        if self.spec.model == "bad":
            raise EngineError("engine exited with code 1 before it was ready")
        self.port, self.ready_s = 1234, 0.5
        self.compile_cache = {"cache": "warm"}
        self.proc = object()

    def alive(self):
        return self.proc is not None and self.log_dir.name not in state["dead"]

    def stop(self, grace_s=None):
        state["stopped"].append(self.log_dir.name)
        self.proc = None

    monkeypatch.setattr(launch.EngineServer, "start", start)
    monkeypatch.setattr(launch.EngineServer, "alive", alive)
    monkeypatch.setattr(launch.EngineServer, "stop", stop)
    return state


def spec(model="m", *args) -> LaunchSpec:
    return LaunchSpec(model=model, python="py", engine_args=list(args))


def test_a_spare_goes_once_and_only_to_its_own_launch(servers, tmp_path):
    with SpareEngines([spec(), spec()], tmp_path).start() as pool:
        assert pool.take(spec("m", "--other")) is None  # another launch: never handed over
        a, b = pool.take(spec()), pool.take(spec())
        assert a is not None and b is not None and a[0] is not b[0]
        assert a[0].owner == threading.get_ident()  # the taker cancels it with its thread
        assert a[1].what.startswith("spare-") and a[1].ready_s == 0.5
        assert pool.take(spec()) is None and pool.waiting == 0
    assert servers["stopped"] == []  # the takers stop them, not the pool


def test_a_failed_or_dead_spare_is_not_handed_over(servers, tmp_path):
    servers["dead"].add("spare-2")
    with SpareEngines([spec("bad"), spec(), spec()], tmp_path).start() as pool:
        assert pool.take(spec("bad")) is None  # its start failed: the replay launches its own
        got = pool.take(spec())
        assert got is not None and got[0].log_dir.name == "spare-3"  # spare-2 died: skipped
    # both stopped: a start that failed after its launch must leave no process either
    assert servers["stopped"] == ["spare-1", "spare-2"]


def test_close_stops_every_spare_not_taken(servers, tmp_path):
    pool = SpareEngines([spec(), spec(), spec("m", "--x")], tmp_path).start()
    taken = pool.take(spec())
    pool.close()
    pool.close()  # idempotent
    assert sorted(servers["stopped"]) == ["spare-2", "spare-3"]
    assert taken is not None and taken[0].log_dir.name == "spare-1"


def test_take_waits_for_a_spare_still_starting(servers, tmp_path):
    servers["gate"].clear()
    with SpareEngines([spec()], tmp_path).start() as pool:
        threading.Timer(0.3, servers["gate"].set).start()
        got = pool.take(spec())
        assert got is not None and servers["started"] == ["spare-1"]


def test_a_session_adopts_a_spare_instead_of_launching(servers, tmp_path):
    target = Target(url=None, model_path="m", served_name=None, python="py")
    s = target.launch_spec()
    with SpareEngines([s], tmp_path / "spares").start() as pool:
        with EngineSession(Console(file=None, quiet=True), tmp_path, signals=False,
                           spares=pool) as session:
            srv = session._launch(target, s, tmp_path, "engine", "engine")
            assert srv.log_dir == tmp_path / "spares" / "spare-1"
            assert session.servers == [srv] and session.launched
            (st,) = session.starts
            assert st.spare and st.what == "engine" and "started ahead" in st.text()
            # no spare left: the next launch starts its own process
            own = session._launch(target, s, tmp_path, "engine2", "engine")
            assert own.log_dir == Path(tmp_path) and not session.starts[1].spare
        assert sorted(servers["stopped"]) == ["spare-1", tmp_path.name]  # the session stops both


def test_a_cancelled_taker_hands_the_spare_back_and_close_stops_it(servers, tmp_path):
    """A replay whose side-by-side job was stopped (Ctrl-C during the confirmation) while it
    waited for a spare: Cancelled, and the spare stays the pool's, stopped when it closes."""
    me = {threading.get_ident()}
    with SpareEngines([spec()], tmp_path).start() as pool:
        cancel_threads(me)
        try:
            with pytest.raises(Cancelled):
                pool.take(spec())
        finally:
            cancel_threads(me, undo=True)
        assert pool.waiting == 1 and servers["stopped"] == []
    assert servers["stopped"] == ["spare-1"]


def test_a_pool_closed_before_its_threads_began_launches_nothing(servers, tmp_path):
    pool = SpareEngines([spec(), spec()], tmp_path)
    pool.close()
    pool.start()
    pool.close()
    assert servers["started"] == [] and pool.take(spec()) is None
