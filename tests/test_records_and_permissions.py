"""Issue 37 items 2-4: every job leaves a record, a server that needs a key is named with the
option that fixes it, and one permission rule (folders 0700, files 0600) for what the harness
writes. Engine starts here fail at once (tests/fakepy/python with PLE_FAULT_FAIL_START) or are
not needed (a tiny HTTP server that answers 401)."""
import json
import os
import stat
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import ROOT, run_cli
from pleharness.files import private_dir, private_file, write_private

FAKE_PY = str(ROOT / "tests" / "fakepy" / "python")
FAIL = {"PLE_FAULT_FAIL_START": "always", "PLE_REAL_PYTHON": sys.executable,
        "PLE_FAULT_UPSTREAM": "http://127.0.0.1:9"}


def mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def assert_private(root):
    """Every folder under ``root`` (itself included) 0700, every file 0600."""
    assert mode(root) == 0o700, root
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            assert mode(os.path.join(dirpath, d)) == 0o700, os.path.join(dirpath, d)
        for f in files:
            assert mode(os.path.join(dirpath, f)) == 0o600, os.path.join(dirpath, f)


def test_the_rule_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        d = private_dir(tmp_path / "a" / "b" / "c")
        with private_file(d / "log", "w") as f:
            f.write("x")
        write_private(d / "x.json", "{}")
    finally:
        os.umask(old)
    assert_private(tmp_path / "a")
    keep = tmp_path / "mine"
    keep.mkdir(mode=0o755)
    os.chmod(keep, 0o755)
    private_dir(keep)  # a folder that exists keeps its own mode (the user's results/)
    assert mode(keep) == 0o755


def test_selftest_whose_engine_cannot_start_leaves_its_record(tmp_path):
    r = run_cli("selftest", "--engine-python", FAKE_PY, "--results-dir", str(tmp_path),
                "--run-id", "st", "--start-timeout", "60", env=FAIL, timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr
    data = json.loads((tmp_path / "st" / "selftest.json").read_text())
    assert data["status"] == "failed" and data["exit_code"] == 3
    assert (data["job"]["status"], data["job"]["exit_code"]) == ("failed", 3)
    assert "planted start failure" in (data["root_cause"] or ""), data
    assert data["engine_log"] and data["passes"] == []
    assert_private(tmp_path / "st")


def test_facts_folder_and_json_are_private(tmp_path):
    r = run_cli("facts", "--engine-python", FAKE_PY, "--results-dir", str(tmp_path / "res"),
                "--start-timeout", "60", "--json", str(tmp_path / "out" / "facts.json"),
                env=FAIL, timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr
    (folder,) = (tmp_path / "res").iterdir()
    assert folder.name.startswith("facts-")
    assert_private(tmp_path / "res")
    job = json.loads((tmp_path / "out" / "facts.json").read_text())["job"]  # its record
    assert (job["job"], job["status"], job["exit_code"]) == ("facts", "failed", 3)
    assert "planted start failure" in (job["root_cause"] or ""), job
    assert_private(tmp_path / "out")


class _NeedsKey(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            self.send_response(200)
            self.end_headers()
            return
        ok = self.headers.get("Authorization") == "Bearer right"
        body = json.dumps({"data": [{"id": "m", "root": "m"}]} if ok else
                          {"error": "Unauthorized"}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_a_server_that_needs_a_key_names_the_option(tmp_path):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _NeedsKey)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        r = run_cli("facts", "--url", url, timeout=120)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "answered 401" in r.stderr and "--api-key-env NAME" in r.stderr
        r = run_cli("facts", "--url", url, "--api-key-env", "PLE_K", env={"PLE_K": "wrong"},
                    timeout=120)
        assert r.returncode == 2 and "the API key was refused" in r.stderr, r.stderr
        assert "wrong" not in r.stdout + r.stderr
        r = run_cli("stress", "--url", url, "--results-dir", str(tmp_path), timeout=120)
        assert r.returncode in (2, 3) and "--api-key-env" in r.stderr, r.stdout + r.stderr
    finally:
        srv.shutdown()


# -- issue 36 item 4: messages that name the real problem --------------------------------------
def test_messages_name_the_real_problem(tmp_path):
    for args, want in ((("stress", "--near-tie-nats", "nan"), "--near-tie-nats 'nan': not a "
                        "finite number"),
                       (("fuzz", "--time-budget", "inf"), "--time-budget 'inf': not a finite "
                        "number"),
                       (("stress", "--scenario", str(tmp_path)), "a folder, not a file (scenario"),
                       (("stress", "--engine-profile", str(tmp_path)), "a folder, not a")):
        r = run_cli(*args, "--results-dir", str(tmp_path / "res"), timeout=120)
        assert r.returncode == 2 and want in r.stderr, (args, r.stderr)
        assert not (tmp_path / "res").exists() or not any((tmp_path / "res").iterdir())
    r = run_cli("stress", "--url", "http://127.0.0.1:9", "--api-key-env", "PLE_EMPTY_KEY",
                env={"PLE_EMPTY_KEY": ""}, timeout=60)
    assert r.returncode == 2 and "PLE_EMPTY_KEY: that environment variable is empty" in r.stderr


def test_a_byte_order_mark_is_read_past(tmp_path):
    from pleharness.scenarios import load_scenario_file
    f = tmp_path / "bom.toml"
    f.write_bytes(b"\xef\xbb\xbf" + (ROOT / "scenarios" / "boundary.toml").read_bytes())
    assert load_scenario_file(str(f)).kind == "boundary"


def test_a_closed_pipe_exits_quietly():
    """``ple-harness ... | head -1``: 141 (SIGPIPE's convention) when the reader left before the
    output ended, 0 when it all fit in the pipe first (a timing matter); never 1, never a
    message."""
    import subprocess
    for args, n in (("scenarios", 1), ("--help", 1), ("stress --help", 1),
                    ("explain --help", 20), ("--help", 20)):  # 20: click's own EPIPE path
        q = subprocess.run(["/bin/bash", "-c", f"{sys.executable} -m pleharness {args} | "
                            f"head -{n} >/dev/null; echo ${{PIPESTATUS[0]}}"],
                           cwd=ROOT, capture_output=True, text=True)
        assert q.stdout.strip() in ("0", "141") and q.stderr == "", (args, q.stdout, q.stderr)
