"""Failure handling against engine doubles that answer themselves (tests/doubles.py FakeEngine):
500s, malformed stream chunks, missing token_ids, stalls, requests never answered, an engine that
dies mid-phase. Each run must leave a valid manifest with the right record, status and exit code,
and no process behind.

Schedule used: transitions with ladder 2,1 once, max_tokens 8: warm-up 4 requests (1-4),
references: cold 8 (5-12) and warm 8 (13-20), phase C2 (21-24: 22 is an identical copy of 21,
23 is non-streamed), phase C1 (25-26). Faults are keyed to a prompt and its run (PromptRun: e.g.
the identical copy of the C2 phase's first prompt; stream-chunk faults go to that prompt's load
request, which is streamed), never to a bare arrival number.
"""
import psutil

from conftest import load_json, run_cli
from doubles import FakeEngine, PromptRun
from pleharness.scenarios.transitions import TransitionsParams

# prompt numbers for PromptRun: the warm-up's prompts come first, then the scenario's (P0 is the
# first prompt of the C2 phase, sent twice at once; P1 its non-streamed third request, P2 its last)
P0 = TransitionsParams.model_fields["warmup_requests"].default
P1, P2 = P0 + 1, P0 + 2
LOAD, COPY = 3, 4  # runs of a prompt: 1 cold reference, 2 warm reference, 3 load, 4 its copy
# (P0's runs 3 and 4 are in flight together and both streamed: which arrives first is a race)

ARGS = ["--scenario", "transitions", "--ladder", "2,1", "--repeats", "1", "--max-tokens", "8",
        "--vocab-size", "600", "--first-token-timeout", "2", "--between-tokens-timeout", "2"]


def run_against(behave, tmp_path, run_id="run", *extra):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with FakeEngine(behave) as eng:
        r = run_cli("stress", "--url", eng.url, "--results-dir", str(tmp_path), "--run-id", run_id,
                    *ARGS, *extra, timeout=120)
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before, "the harness left processes behind"
    return r, r.stdout + r.stderr, load_json(tmp_path / run_id / "manifest.json")


def errored(m):
    return [q for q in m["requests"] if q["error"]]


def test_healthy_double_passes(tmp_path):
    r, out, m = run_against(None, tmp_path)
    assert r.returncode == 0, out[-2000:]
    assert m["summary"]["hashes_matched"] == m["summary"]["hashes_compared"] == 14


def test_http_500_is_recorded_not_matched(tmp_path):
    r, out, m = run_against(PromptRun("http500", (P0, COPY)), tmp_path)
    assert r.returncode == 1, out[-2000:]
    (q,) = errored(m)
    assert q["error"] == "http" and q["http_status"] == 500 and q["match"] is False
    assert q["error_detail"].startswith("HTTP 500: ") and "injected failure" in q["error_detail"]
    ph = [p for p in m["phases"] if p["name"] == q["phase"]][0]
    assert ph["errors"] == 1 and ph["status"] == "fail" and "1 request error(s)" in ph["reason"]
    assert m["status"] == "complete" and m["verdict"] == "fail"


def test_malformed_chunk(tmp_path):
    r, out, m = run_against(PromptRun("malformed", (P0, LOAD)), tmp_path)
    assert r.returncode == 1, out[-2000:]
    (q,) = errored(m)
    assert q["error"] == "protocol" and q["error_detail"].startswith(
        "malformed stream chunk after 2 tokens")
    assert q["output_len"] == 2 and q["match"] is False


def test_missing_token_ids(tmp_path):
    r, out, m = run_against(PromptRun("no_token_ids", (P0, LOAD)), tmp_path)
    assert r.returncode == 1, out[-2000:]
    (q,) = errored(m)
    assert q["error"] == "protocol" and "without token_ids" in q["error_detail"]


def test_stalled_stream_times_out_and_run_continues(tmp_path):
    r, out, m = run_against(PromptRun("stall", (P0, LOAD)), tmp_path)
    assert r.returncode == 1, out[-2000:]
    (q,) = errored(m)
    assert q["error"] == "timeout" and q["output_len"] == 3
    assert q["error_detail"] == "stalled: no token for 2 s after 3 tokens"
    assert [p["status"] for p in m["phases"] if p["role"] == "load"] == ["fail", "pass"]
    assert m["status"] == "complete"


def test_stall_with_abort_policy(tmp_path):
    r, out, m = run_against(PromptRun("stall", (P0, LOAD)), tmp_path, "run", "--on-timeout", "abort")
    assert r.returncode == 1, out[-2000:]
    assert m["status"] == "incomplete" and "--on-timeout abort" in m["reason"]
    assert [p["status"] for p in m["phases"] if p["role"] == "load"] == ["fail"]
    assert m["summary"]["phases_completed"] == 1 and m["summary"]["phases_planned"] == 2


def test_request_never_answered(tmp_path):
    r, out, m = run_against(PromptRun("never", (P2, LOAD)), tmp_path)
    assert r.returncode == 1, out[-2000:]
    (q,) = errored(m)
    assert q["error"] == "timeout" and q["error_detail"] == "no token within 2 s"


def test_engine_dies_mid_phase(tmp_path):
    r, out, m = run_against(PromptRun("die", (P0, COPY)), tmp_path)
    assert r.returncode == 3, out[-2000:]
    assert m["status"] == "engine_died" and m["verdict"] == "error" and m["exit_code"] == 3
    assert "engine" in m["reason"]
    bad = errored(m)
    assert bad and all(q["phase"] == "r1-s1-C2" and q["match"] is False for q in bad)
    assert m["summary"]["phases_completed"] == 1 and m["summary"]["phases_planned"] == 2
    assert "1/2 phases completed" in out


def test_bad_command_lines_fail_before_anything_starts(tmp_path):
    import socket
    cases = [
        (["--url", "http://127.0.0.1:9"], "--url: no engine answers GET http://127.0.0.1:9/health"),
        (["--model", str(tmp_path / "nope")], f"model path {tmp_path / 'nope'} does not exist"),
        (["--engine-python", "/nope/python"], "engine Python '/nope/python' does not exist"),
        (["--results-dir", "/proc/ple"], "results directory /proc/ple cannot be created"),
        (["--scenario", "nope"], "unknown scenario 'nope'"),
        (["--api-key-env", "PLE_NOT_SET_X"], "--api-key-env PLE_NOT_SET_X: that environment "
                                             "variable is not set"),
        (["--ladder", "4,x"], "--ladder '4,x': expected comma-separated concurrency levels"),
        (["--run-id", "../escape"], "--run-id '../escape': a plain folder name is needed"),
    ]
    for args in (["--bogus"], ["--suite-repeats", "0"], ["--logprobs", "-1"], ["--first-token-timeout",
                                                                         "-5"], ["--tp", "0"]):
        r = run_cli("stress", *args, timeout=60)
        assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr, (args, r.stderr)
        assert "Usage: " in r.stdout + r.stderr
    for args, message in cases:
        r = run_cli("stress", *args, timeout=120)
        assert r.returncode == 2, (args, r.stdout + r.stderr)
        assert r.stderr.startswith("error: ") and message in r.stderr, (args, r.stderr)
        assert r.stdout == "", "errors go to stderr"
        assert "Traceback" not in r.stdout + r.stderr
    with socket.socket() as s:  # a fixed port that is taken: a clear engine error, exit 3
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_cli("stress", "--port", str(port), "--results-dir", str(tmp_path), timeout=300)
        assert r.returncode == 2 and f"--port {port}: port {port} on 127.0.0.1 is already in use" \
            in r.stderr


def test_sigterm_during_a_hung_request(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    from conftest import ROOT
    behave = PromptRun("never", (P0, COPY))
    with FakeEngine(behave) as eng:
        proc = subprocess.Popen([sys.executable, "-m", "pleharness", "stress", "--url", eng.url,
                                 "--results-dir", str(tmp_path), "--run-id", "term", *ARGS[:-4],
                                 "--no-engine-probe",
                                 "--first-token-timeout", "60"], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        end = time.monotonic() + 60
        while not behave.fired and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.3)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    assert proc.returncode == 143, out[-2000:]
    assert took < 15, "in-flight requests must be abandoned, not waited for"
    m = load_json(tmp_path / "term" / "manifest.json")
    assert m["status"] == "interrupted" and m["reason"] == "interrupted by SIGTERM"
    # the phase with the hung request keeps (records and compares) the requests that finished
    (ph,) = [p for p in m["phases"] if p["role"] == "load"]
    kept = [q for q in m["requests"] if q["phase"] == ph["name"]]
    assert ph["status"] == "interrupted" and 1 <= len(kept) <= 3
    assert ph["reason"].startswith(f"interrupted after {len(kept)} of 4 requests finished")
    assert all(q["error"] is None and q["match"] is True for q in kept)
    assert ph["matched"] == len(kept)


def test_non_streamed_request_never_answered_times_out(tmp_path):
    """A non-streamed request gets no response headers until its whole answer is ready; one that
    never gets them must still end at the first-token timeout (the socket's read timeout is the
    only limit before headers), not after --request-timeout."""
    fired = []

    def never_plain(k, body):
        if not body.get("stream", True) and not fired:
            fired.append(k)
            return "never"
        return None
    import time
    t0 = time.monotonic()
    r, out, m = run_against(never_plain, tmp_path)
    assert fired and time.monotonic() - t0 < 90
    assert r.returncode == 1, out[-2000:]
    (q,) = errored(m)
    assert q["error"] == "timeout" and q["error_detail"] == "no token within 2 s"


def test_engine_without_tokenize_is_an_engine_error_not_a_harness_bug(tmp_path):
    """The insert scenario builds chat prompts with the engine's /tokenize; an engine that cuts
    that request (the double has no /tokenize) is an engine failure: exit 3, the manifest says
    which endpoint failed. It used to escape as requests' ChunkedEncodingError: exit 4, 'a
    ple-harness bug'."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with FakeEngine() as eng:
        r = run_cli("stress", "--url", eng.url, "--results-dir", str(tmp_path), "--run-id", "tok",
                    "--scenario", "insert", "--vocab-size", "600", "--block-size", "16",
                    "--chunk-size", "64", "--num-speculative-tokens", "0", timeout=120)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    out = r.stdout + r.stderr
    assert r.returncode == 3, out[-2000:]
    m = load_json(tmp_path / "tok" / "manifest.json")
    assert m["status"] in ("failed", "engine_died") and m["verdict"] == "error"
    assert m["reason"].startswith("/tokenize failed"), m["reason"]
    assert "harness bug" not in out and not (tmp_path / "tok" / "harness-error.log").exists()
