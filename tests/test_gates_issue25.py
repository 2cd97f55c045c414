"""Issue 25: gates that cannot lie. One section per item of the issue, each with the issue's own
inputs (the committed GPU manifests under docs/gpu-runs/, the flags it quotes)."""
import json
import sys

import pytest

from conftest import ROOT, run_cli
from pleharness.compare import compare
from pleharness.manifest import load_manifest
from pleharness.parity import token_hash

GPU = ROOT / "docs" / "gpu-runs"
# runs whose request records are committed too (schema 1 inline; runs k-m of 2026-12-01 kept only
# manifest.json and summary.md: the device returns at most 8 files a call, requests.jsonl was not
# among them)
GPU_RUNS = sorted(p.parent for p in GPU.glob("*/manifest.json")
                  if (p.parent / "requests.jsonl").exists()
                  or '"schema_version": 1' in p.read_text()[:20000]
                  or json.loads(p.read_text()).get("schema_version") == 1)
FAILED_ON_THEIR_OWN = {"2026-11-29-d-random-weights-cold-reference",
                       "2026-11-29-e-random-weights-no-prefix-cache",
                       "2026-11-29-f-random-weights-warm-reference"}


# -- 1. compare judges near ties as the run does ---------------------------------------------
def test_committed_gpu_runs_have_eight_manifests():
    assert len(GPU_RUNS) == 8, GPU_RUNS


@pytest.mark.parametrize("run", GPU_RUNS, ids=lambda p: p.name)
def test_compare_of_each_committed_gpu_run_with_itself(run):
    """The same folder twice: token parity passes (near ties included: d, e, f, g), with a
    warning that it is the same run; the exit code is 0 unless the run failed on its own (d, e,
    f: random weights, failed checks), and the last line agrees with it."""
    r = run_cli("compare", str(run), str(run), timeout=120)
    out = r.stdout
    assert "PASS token parity" in out and "FAIL token parity" not in out, out[-3000:]
    assert "warning: BASE and HEAD are the same run" in out
    last = out.strip().splitlines()[-1]
    if run.name in FAILED_ON_THEIR_OWN:
        assert r.returncode == 1, out[-2000:]
        fails = [x for x in out.splitlines() if x.startswith("FAIL")]
        assert len(fails) == 1 and fails[0].startswith("FAIL HEAD verdict"), fails
        assert last.startswith("verdict: fail (HEAD failed its own run and BASE failed too")
    else:
        assert r.returncode == 0, out[-2000:]
        assert last == "verdict: pass (HEAD passed and matches BASE)"


def test_g_with_itself_keeps_the_near_tie_as_a_warning():
    g = GPU / "2026-11-30-g-random-ngram-control"
    r = run_cli("compare", str(g), str(g))
    assert r.returncode == 0, r.stdout
    assert "warning: parity: p5-len216 (max_tokens 32): identical, with 1 output(s) that differ " \
           "from their reference only by divergences their own run tolerated (also_in_control)" \
        in r.stdout
    assert "PASS token parity: 8 prompts identical (1 with near-tie warnings)" in r.stdout


def test_a_vs_c_tp1_vs_tp2_both_passing_passes():
    """The one "differing" prompt of a vs c was a warmup output, which neither run judges."""
    r = run_cli("compare", str(GPU / "2026-11-29-a-default-tp1"),
                str(GPU / "2026-11-29-c-default-tp2"))
    assert r.returncode == 0, r.stdout
    assert "p2-len202" not in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "verdict: pass (HEAD passed and matches BASE)"


def _flip(m, ref, pos: int, new_tok: int):
    """HEAD = ``m`` whose outputs for ``ref``'s prompt take ``new_tok`` at ``pos`` (and keep the
    rest): the reference and every request of that prompt, consistently."""
    ids = list(ref.output_ids)
    ids[pos] = new_tok
    h = token_hash(ids)
    for r in m.references:
        if (r.prompt_hash, r.max_tokens) == (ref.prompt_hash, ref.max_tokens):
            r.output_ids, r.output_hash = ids, h
    for q in m.requests:
        if (q.prompt_hash, q.max_tokens) == (ref.prompt_hash, ref.max_tokens) and q.output_hash:
            q.output_hash = h
            q.reference_hash = h


def _margin_position(m, below: bool):
    thr = m.run_options.near_tie_nats
    for ref in m.references:
        for i, x in enumerate(ref.margins or []):
            if x is not None and ((x < thr) if below else (x >= 1.0)):
                return ref, i
    raise AssertionError("no such position in the committed run")


@pytest.mark.parametrize("below", [True, False], ids=["near-tie", "hard"])
def test_a_difference_across_runs_is_classified_by_the_reference_margin(below):
    a = GPU / "2026-11-29-a-default-tp1"
    base, head = load_manifest(a), load_manifest(a)
    ref, pos = _margin_position(base, below)
    href = next(r for r in head.references if r.prompt_hash == ref.prompt_hash
                and r.max_tokens == ref.max_tokens)
    _flip(head, href, pos, (ref.output_ids[pos] + 1) % 700)
    res = compare(base, head)
    if below:
        assert res.passed, res.gate_failures
        assert any(f"differ by a near tie, first divergent position {pos} " in w
                   for w in res.warnings), res.warnings
    else:
        assert not res.passed
        (mm,) = res.parity_mismatches
        assert mm["first_divergence"] == pos
        assert mm["detail"].startswith(f"first divergent position {pos} (BASE token "
                                       f"{ref.output_ids[pos]}, HEAD token "
                                       f"{(ref.output_ids[pos] + 1) % 700}; hard: margin")
        assert res.diagnosis == ("HEAD passed its own run but missed token parity against BASE; "
                                 "BASE passed its own run")


def test_more_mismatches_than_shown_are_counted(tmp_path):
    a = GPU / "2026-11-29-a-default-tp1"
    m = json.loads((a / "manifest.json").read_text())
    for q in m["requests"]:
        if q.get("output_hash") and q["phase"] != "warmup":
            q["output_hash"] = "f" * 63 + "0"
    for r in m["references"]:
        r["output_hash"] = token_hash(r["output_ids"] + [5])
    (tmp_path / "head.json").write_text(json.dumps(m))
    r = run_cli("compare", str(a), str(tmp_path / "head.json"))
    assert r.returncode == 1
    n = int(next(x for x in r.stdout.splitlines() if x.startswith("FAIL token parity"))
            .split()[3])
    assert n > 20
    assert r.stdout.count("parity: ") - r.stdout.count("token parity: ") == 20
    assert f"... and {n - 20} more parity mismatches not shown" in r.stdout


def test_last_line_never_contradicts_the_exit_code():
    """M21: failing d as BASE, passing a as HEAD: exit 1, and the last line does not say "fixed by
    this change"; the models differ (a: the embedded model, d: random weights) and it says so."""
    r = run_cli("compare", str(GPU / "2026-11-29-d-random-weights-cold-reference"),
                str(GPU / "2026-11-29-a-default-tp1"))
    assert r.returncode == 1
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("verdict: fail (BASE and HEAD serve different models")
    assert "fixed by this change" not in r.stdout


def test_threshold_c0_is_a_usage_error():
    a = str(GPU / "2026-11-29-a-default-tp1")
    r = run_cli("compare", a, a, "--threshold", "C0>=1")
    assert r.returncode == 2 and r.stderr.startswith("error: --threshold 'C0>=1'"), r.stderr


# -- 4. every manifest schema ever written renders in every format ---------------------------
@pytest.mark.parametrize("run", GPU_RUNS, ids=lambda p: p.name)
def test_every_committed_gpu_manifest_renders_in_every_format(run, tmp_path):
    """R17/R20: markdown crashed (exit 4) on the schema-1 manifests a, b, c, d, f. Every format
    now exits with the run's own exit code and prints its table sections."""
    code = json.loads((run / "manifest.json").read_text())["exit_code"]
    for fmt in ("console", "markdown", "junit"):
        r = run_cli("report", str(run), "--format", fmt, timeout=120)
        assert r.returncode == code, (fmt, r.stderr[-2000:])
        assert "internal error" not in r.stderr and r.stdout, fmt
    md = run_cli("report", str(run), "-f", "markdown").stdout
    if "boundary" in {s["kind"] for s in load_manifest(run, with_requests=False).scenarios}:
        assert "does not fit" not in md and "oundary" in md


def test_a_table_row_of_an_unknown_shape_is_named_not_a_crash(tmp_path):
    m = json.loads((GPU / "2026-11-29-a-default-tp1" / "manifest.json").read_text())
    m["tables"]["boundary"][0] = {"length": "garbage"}
    (tmp_path / "m.json").write_text(json.dumps(m))
    r = run_cli("report", str(tmp_path / "m.json"), "-f", "markdown")
    assert r.returncode == 0, r.stderr
    assert "(this manifest's boundary table does not fit this ple-harness's row model" in r.stdout


# -- 3. empty values are usage errors, not defaults -------------------------------------------
DEAD = "http://127.0.0.1:9"


@pytest.mark.parametrize("argv", [
    ["stress", "--model", ""], ["stress", "--model="], ["stress", "--engine-python", ""],
    ["stress", "--host", ""], ["stress", "--api-key-env", ""], ["stress", "--engine-profile", ""],
    ["stress", "--control-profile", ""], ["stress", "--golden-model", ""],
    ["stress", "--engine-arg", ""], ["fuzz", "--model", ""], ["fuzz", "--engine-python", ""],
    ["facts", "--model", ""], ["facts", "--engine-python", ""], ["facts", "--engine-profile", ""],
    ["build-model", "--engine-python", ""],
])
def test_an_empty_value_is_a_usage_error_naming_the_flag(argv):
    r = run_cli(*argv, timeout=60)
    flag = argv[1].split("=")[0]
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"error: {flag} '': an empty value (an unset variable in a CI "
                               "job?)"), r.stderr
    assert r.stdout == ""


def test_several_empty_values_are_listed_together():
    r = run_cli("stress", "--model", "", "--host", " ", "--url", DEAD)
    assert r.returncode == 2
    assert "2 problems with the options" in r.stderr
    assert "--model ''" in r.stderr and "--host ' '" in r.stderr


@pytest.mark.parametrize("text, key", [
    ("", None), ('model = ""\n', "model"), ('python = " "\n', "python"),
    ('host = ""\n', "host"), ('engine_args = [""]\n', "engine_args"),
    ('[env]\n"" = "x"\n', "env"),
])
def test_an_empty_profile_or_empty_profile_value_is_a_usage_error(tmp_path, text, key):
    p = tmp_path / "p.toml"
    p.write_text(text)
    r = run_cli("stress", "--engine-profile", str(p), "--engine-python", "/bin/false")
    assert r.returncode == 2, r.stdout + r.stderr
    if key is None:
        assert r.stderr.startswith(f"error: {p}: an empty engine profile (no keys)"), r.stderr
    else:
        assert r.stderr.startswith(f"error: {p}: {key}"), r.stderr
        assert "empty" in r.stderr


def test_a_regular_file_as_model_is_a_usage_error(tmp_path):
    f = tmp_path / "hostname"
    f.write_text("x\n")
    r = run_cli("stress", "--model", str(f), "--engine-python", sys.executable,
                "--results-dir", str(tmp_path / "res"), timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"--model {f}: a file, not a model folder" in r.stderr


# -- 2. a control or reference engine identical to the engine under test ----------------------
FAKE_PY = str(ROOT / "tests" / "fakepy" / "python")


def stress_fake(tmp_path, *args):
    """``stress`` launching the engine double: every case here must stop with a usage error
    before anything is launched or a run folder exists."""
    res = tmp_path / "res"
    r = run_cli("stress", "--engine-python", FAKE_PY, "--results-dir", str(res), *args,
                env={"PLE_REAL_PYTHON": sys.executable}, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert not res.exists(), "nothing is created for a usage error"
    return r.stderr


def test_control_drop_of_a_flag_not_in_the_args_is_a_usage_error(tmp_path):
    err = stress_fake(tmp_path, "--control-drop-arg=--no-such-flag")
    assert err.startswith("error: --control-drop-arg=--no-such-flag: not among the engine under "
                          "test's arguments (--block-size 32 --max-num-batched-tokens 256 "
                          "--dtype float32), so dropping it changes nothing"), err


def test_control_profile_equal_to_engine_profile_is_a_usage_error(tmp_path):
    err = stress_fake(tmp_path, "--engine-profile", "cpu-ngram", "--control-profile", "cpu-ngram")
    line = err.splitlines()[-1]
    assert line.startswith(f"error: --control-profile {ROOT / 'profiles' / 'cpu-ngram.toml'}: "
                           "the control engine would be identical to the engine under test"), err


def test_control_arg_that_repeats_an_engine_arg_is_a_usage_error(tmp_path):
    err = stress_fake(tmp_path, "--control-engine-arg=--dtype=float32")
    assert err.startswith("error: --control-engine-arg --dtype=float32: the control engine would "
                          "be identical to the engine under test"), err


def test_reference_engine_without_a_change_is_a_usage_error(tmp_path):
    err = stress_fake(tmp_path, "--reference", "engine")
    assert err.startswith("error: --reference engine without --reference-engine-arg or "
                          "--reference-drop-arg: the reference engine would be identical to the "
                          "engine under test"), err
    err = stress_fake(tmp_path, "--reference", "engine", "--reference-drop-arg=--enforce-eager")
    assert err.startswith("error: --reference-drop-arg=--enforce-eager: not among the engine "
                          "under test's arguments"), err


def test_underscore_spelling_drops_the_flag_as_vllm_reads_it():
    """C20: --control-drop-arg=--speculative_config on cpu-ngram. vLLM's parser reads
    --speculative_config as --speculative-config, so the drop now removes it and the control
    differs (it is no longer silently identical)."""
    from pleharness.attribution import unused_drops
    from pleharness.engine.session import control_args
    from pleharness.profile import load_profile
    args = load_profile(ROOT / "profiles" / "cpu-ngram.toml").engine_args
    out = control_args(args, ["--speculative_config"])
    assert "--speculative-config" not in out and len(out) == len(args) - 2
    assert unused_drops(args, ["--speculative_config"]) == []
    assert unused_drops(args, ["--speculative-configs"]) == ["--speculative-configs"]


def test_reference_engine_inherits_the_engine_arguments():
    from pleharness.engine.session import Target
    from pleharness.config import ReferenceConfig, StressConfig
    from pleharness.second_engine import reference_config, second_engine_problems
    t = Target(url=None, model_path="/m", served_name=None, python="py",
               engine_args=["--max-num-seqs", "8", "--speculative-config", "{}", "--dtype=float32"],
               engine_env={"A": "1"})
    cfg = StressConfig(reference=ReferenceConfig(source="engine",
                                                 drop_args=["--speculative-config"],
                                                 engine_args=["--enforce-eager"]))
    args, env = reference_config(cfg, t)
    assert args == ["--max-num-seqs", "8", "--dtype=float32", "--enforce-eager"] and env == {"A": "1"}
    assert second_engine_problems(cfg, t) == []


def test_help_states_what_the_reference_engine_inherits():
    out = run_cli("stress", "--help").stdout
    flat = " ".join(out.replace("│", " ").split())
    assert "The reference engine inherits the engine under test's model, python, tp, env and " \
           "arguments" in flat, flat
    assert "--reference-drop-arg" in out


# -- 5. one redaction rule; run outputs 0600 / 0700 -------------------------------------------
SECRETS = ["--engine-arg=--hf-token=sk-ENGINEARG-SECRET-42",  # (--api-key: the harness's own)
           "--engine-env", "OPENAI_API_KEY=sk-ENVKEY-SECRET-43",
           "--engine-env", "DB_URL=postgres://u:pw-SECRET-44@h/db",
           "--engine-env=PLAIN_NAME=value-SECRET-47",
           "--control-engine-arg=--hf-token", "--control-engine-arg=sk-TWO-TOKEN-SECRET-45"]


def test_no_secret_reaches_any_file_or_the_console(tmp_path):
    """E09/E10 and the two-token form: the engine double is not ready within 3 s (exit 3), after
    the run folder, launcher.log, engine.log, manifest.json, summary.md and junit.xml exist."""
    res = tmp_path / "res"
    r = run_cli("stress", *SECRETS, "--engine-python", FAKE_PY, "--results-dir", str(res),
                "--run-id", "leak", "--start-timeout", "3",
                env={"PLE_REAL_PYTHON": sys.executable, "PLE_FAULT_UPSTREAM": ""}, timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr
    run = res / "leak"
    names = {p.name for p in run.iterdir()}
    assert {"manifest.json", "summary.md", "junit.xml", "launcher.log", "engine.log"} <= names
    assert "SECRET" not in r.stdout + r.stderr
    for p in run.iterdir():
        text = p.read_text(errors="replace")
        if p.name != "engine.log":  # the engine's own output is the engine's (0600 below)
            assert "SECRET" not in text, (p.name, [x for x in text.split() if "SECRET" in x])
    m = json.loads((run / "manifest.json").read_text())
    inv = m["invocation"]
    assert "OPENAI_API_KEY=<redacted>" in inv and "DB_URL=<redacted>" in inv
    assert "--engine-env=PLAIN_NAME=<redacted>" in inv
    assert "--engine-arg=--hf-token=<redacted>" in inv
    assert inv[inv.index("--control-engine-arg=--hf-token") + 1] == "--control-engine-arg=<redacted>"
    assert "--engine-python" in inv and FAKE_PY in inv, "the rest stays as it was run"
    assert "--hf-token=<redacted>" in m["engine"]["launch"]["engine_args"]
    assert "<redacted>" in (run / "launcher.log").read_text()
    summary = (run / "summary.md").read_text()
    assert "OPENAI_API_KEY=<redacted>" in summary
    # one mode for every run output: the folder 0700, every file 0600
    assert run.stat().st_mode & 0o777 == 0o700
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in run.iterdir()}
    assert set(modes.values()) == {"0o600"}, modes


def test_a_url_password_is_not_echoed():
    r = run_cli("stress", "--url", "http://user:pw-SECRET-46@127.0.0.1:9")
    assert r.returncode == 2
    assert "SECRET" not in r.stdout + r.stderr and "user:<redacted>@127.0.0.1:9" in r.stderr
    r = run_cli("stress", "--url", "ftp://user:pw-SECRET-46@127.0.0.1:9")
    assert r.returncode == 2 and "SECRET" not in r.stderr
    # issue 36: a secret in the query or fragment is not echoed either
    r = run_cli("stress", "--url", "http://127.0.0.1:9/?token=SECRET-47&x=1#sig=SECRET-48")
    assert r.returncode in (2, 3), r.stderr
    assert "SECRET" not in r.stdout + r.stderr and "token=<redacted>&x=1" in r.stderr, r.stderr


def test_query_parameters_redacted_by_name():
    from pleharness.redact import redact_url
    assert redact_url("http://h/v1?api_key=K&max_tokens=5#access_token=T") == \
        "http://h/v1?api_key=<redacted>&max_tokens=5#access_token=<redacted>"
    assert redact_url("https://b.s3/o?X-Amz-Signature=abc&X-Amz-Date=1") == \
        "https://b.s3/o?X-Amz-Signature=<redacted>&X-Amz-Date=1"
    assert redact_url("plain text a=b") == "plain text a=b"


def test_redaction_rule_on_engine_command_lines():
    from pleharness.redact import redact_argv, redact_env
    cmd = ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--api-key", "k1",
           "--api-key=k2", "--hf-token", "k3", "--max-num-seqs", "8"]
    assert redact_argv(cmd) == ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", "m",
                                "--api-key", "<redacted>", "--api-key=<redacted>", "--hf-token",
                                "<redacted>", "--max-num-seqs", "8"]
    assert redact_argv(["--api-key-env", "MY_KEY"]) == ["--api-key-env", "MY_KEY"]
    assert redact_env({"HF_TOKEN": "t", "DB": "mysql://a:b@c/d", "X": "1", "VLLM_API_KEY": "k",
                       "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_URL": "http://a:b@c"}) == \
        {"HF_TOKEN": "<redacted>", "DB": "<redacted>", "X": "<redacted>",
         "VLLM_API_KEY": "<redacted>", "VLLM_CPU_KVCACHE_SPACE": "1",
         "VLLM_URL": "http://a:<redacted>@c"}
    assert redact_argv(["--engine-env", "VLLM_CPU_KVCACHE_SPACE=1", "--engine-env=DB=x"]) == \
        ["--engine-env", "VLLM_CPU_KVCACHE_SPACE=1", "--engine-env=DB=<redacted>"]


# -- the review's other "silently accepted" / "wrong" rows ------------------------------------
@pytest.mark.parametrize("argv, msg", [
    (["stress", "--ladder", "4,,1", "--url", DEAD], "--ladder '4,,1': an empty level"),  # N25
    (["stress", "--near-tie-nats", "inf", "--url", DEAD], "--near-tie-nats"),  # N03
    (["stress", "--near-tie-nats", "1e308", "--url", DEAD], "--near-tie-nats"),  # N24
    (["stress", "--golden-model", "/nonexistent", "--url", DEAD],
     "--golden-model /nonexistent: not a model folder"),  # E13
    (["build-model", "--engine-python", "/nonexistent/python"],
     "--engine-python is used only with --verify"),  # X11
    (["facts", "--url", "ftp://127.0.0.1:9"], "--url 'ftp://127.0.0.1:9': expected an http://"),
    (["facts", "--url", DEAD, "--tp", "4", "--engine-arg=--enforce-eager"],
     "--tp, --engine-arg: launch option(s), but --url attaches to a running engine"),  # C15
    (["stress", "--run-id", "a\nb", "--engine-python", sys.executable, "--results-dir",
      "/tmp/ple-h5-never-created"], "no control characters"),  # D09
])
def test_review_rows_now_refused(argv, msg):
    r = run_cli(*argv, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert msg in r.stderr, r.stderr


def test_facts_finds_a_shipped_profile_by_name(tmp_path):
    """P15: facts --engine-profile cpu-ngram finds the shipped profile as stress does (it gets as
    far as the engine's Python)."""
    r = run_cli("facts", "--engine-profile", "cpu-ngram", "--engine-python", "/nonexistent/py",
                "--results-dir", str(tmp_path), timeout=60)
    assert r.returncode == 2 and "engine profile cpu-ngram not found" not in r.stderr, r.stderr
    assert "/nonexistent/py" in r.stderr
