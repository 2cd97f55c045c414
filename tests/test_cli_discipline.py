"""Issue 17: verdicts CI and reviewers can act on. Each test uses the exact inputs of the issue.

1. compare honours HEAD's own verdict and says whether BASE failed too;
2. exit codes: usage errors exit 2 everywhere, internal errors 4 with a traceback log, report's
   exit code mirrors the run's;
3. streams: machine-readable output alone on stdout, messages on stderr;
4. conflicting or ignored options are errors, checked before anything else;
5. reports lead with the why;
6. help and README.

Runs come from the FakeEngine double (tests/doubles.py) or are built with the manifest models.
"""
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import ROOT, default_stress_options, load_json, run_cli
from doubles import FakeEngine
from pleharness.manifest import (CheckResult, Divergence, EngineRecord, Manifest, load_manifest,
                                 write_manifest)
from pleharness.verdict import summarize

SMALL = ["--scenario", "transitions", "--ladder", "2,1", "--repeats", "1", "--max-tokens", "8",
         "--vocab-size", "600"]
DEAD_URL = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A clean run of the FakeEngine (BASE), and HEAD = that run with 30 usage-check failures, as
    the issue saw it: identical tokens, its own verdict fail."""
    d = tmp_path_factory.mktemp("runs")
    with FakeEngine() as eng:
        r = run_cli("stress", "--url", eng.url, "--results-dir", str(d), "--run-id", "base",
                    *SMALL, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    base = load_manifest(d / "base")
    head = failing_usage(base, "head", 30)
    write(d / "head", head)
    write(d / "base-failing", failing_usage(base, "base-failing", 30))
    return d


def write(run_dir: Path, m: Manifest) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(run_dir / "manifest.json", m)
    return run_dir


def failing_usage(m: Manifest, run_id: str, n: int) -> Manifest:
    """``m`` with a usage-check failure on (up to) ``n`` requests, summarised and judged as the
    stress job does; every request is repeated so that there are enough of them."""
    out = m.model_copy(deep=True)
    out.run_id = run_id
    reqs = [q for q in out.requests if q.output_hash]
    while len(reqs) < n:
        reqs += [q.model_copy(update={"id": q.id + "x"}) for q in reqs]
    for q in reqs[:n]:
        q.checks = [c for c in q.checks if c.name != "usage"] + [CheckResult(
            name="usage", status="fail",
            detail=f"usage.prompt_tokens {q.prompt_len + 1} != intended {q.prompt_len}")]
    out.requests = reqs
    summarize(out)
    out.verdict, out.exit_code = "fail", 1
    return out


# -- 1. compare passes a failing run ----------------------------------------------------------
def test_compare_fails_when_head_failed_and_base_passed(runs):
    r = run_cli("compare", str(runs / "base"), str(runs / "head"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "PASS token parity" in r.stdout, "the tokens are identical: parity alone passes"
    assert "FAIL HEAD verdict: HEAD (head) is 'fail' on its own: check usage failed (30 " \
           "requests" in r.stdout
    assert "verdict: fail (HEAD failed its own run, BASE passed: broken by this change)" in r.stdout
    assert not re.search(r"^verdict: pass", r.stdout, re.M)


def test_compare_two_failing_runs_fails_and_says_broken_before(runs):
    r = run_cli("compare", str(runs / "base-failing"), str(runs / "head"))
    assert r.returncode == 1, r.stdout
    assert "BASE run verdict: fail" in r.stdout and "HEAD run verdict: fail" in r.stdout
    assert "broken before this change" in r.stdout


def test_compare_head_fixing_a_broken_base_passes(runs):
    r = run_cli("compare", str(runs / "base-failing"), str(runs / "base"))
    assert r.returncode == 0, r.stdout
    assert "PASS HEAD verdict" in r.stdout and "fixed by this change" in r.stdout


# -- 2. exit codes ------------------------------------------------------------------------------
def test_bad_threshold_is_a_usage_error(runs):
    r = run_cli("compare", str(runs / "base"), str(runs / "head"), "--threshold", "C4>=1.2.3")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr and r.stdout == ""
    assert r.stderr.startswith("error: --threshold 'C4>=1.2.3': expected e.g. 'C4>=62.985'")
    # checked before the runs are read
    r = run_cli("compare", "/missing-a", "/missing-b", "--threshold", "C4>=1.2.3")
    assert r.returncode == 2 and "--threshold 'C4>=1.2.3'" in r.stderr


def test_empty_plot_path_is_a_usage_error(runs):
    r = run_cli("report", str(runs / "base"), "--plot", "")
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr
    assert r.stderr.startswith("error: --plot '': expected a PNG file path") and r.stdout == ""
    r = run_cli("report", str(runs / "base"), "--plot", str(runs))
    assert r.returncode == 2 and "expected a PNG file path" in r.stderr


def test_probe_json_directory_is_a_usage_error(tmp_path):
    r = run_cli("probe", "--json", "/tmp", timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr
    assert r.stderr.startswith("error: --json '/tmp': is a folder") and r.stdout == ""
    r = run_cli("probe", "--quick", "--json", "/proc/ple/x.json", timeout=300)
    assert r.returncode == 2 and "cannot write" in r.stderr and "Traceback" not in r.stderr


def test_report_exit_code_mirrors_the_run(runs):
    r = run_cli("report", str(runs / "head"))
    assert r.returncode == 1, "a failed run's report exits like the run did"
    assert "verdict: FAIL (status complete, exit 1)" in r.stdout
    r = run_cli("report", str(runs / "head"), "--exit-zero")
    assert r.returncode == 0 and "verdict: FAIL" in r.stdout
    r = run_cli("report", str(runs / "base"))
    assert r.returncode == 0 and "verdict: PASS (status complete, exit 0)" in r.stdout
    m = load_manifest(runs / "base").model_copy(update={"run_id": "killed", "status": "running",
                                                       "exit_code": None, "verdict": None})
    r = run_cli("report", str(write(runs / "killed", m)))
    assert r.returncode == 1 and "recorded no exit code" in r.stderr


def test_internal_error_exits_4_with_a_traceback_log(runs, monkeypatch, capsys):
    from pleharness import cli
    from pleharness.cli import report

    def boom(*a, **k):
        raise RuntimeError("renderer exploded")
    monkeypatch.setattr(report, "render_console", boom)  # the renderer `report` holds
    monkeypatch.setattr(sys, "argv", ["ple-harness", "report", str(runs / "base")])
    with pytest.raises(SystemExit) as e:
        cli.run()
    assert e.value.code == 4
    err = capsys.readouterr().err
    m = re.search(r"internal error: RuntimeError: renderer exploded \(a ple-harness bug; "
                  r"traceback in (\S+)\)", err)
    assert m, err
    log = Path(m.group(1))
    assert "Traceback" in log.read_text() and "renderer exploded" in log.read_text()
    assert "Traceback" not in err
    log.unlink()


@pytest.mark.parametrize("job", ["stress", "fuzz"])
def test_internal_error_during_a_run_exits_4_and_leaves_a_manifest(tmp_path, monkeypatch, job):
    from rich.console import Console

    from pleharness import config, fuzzjob, jobrun, stress
    from pleharness.engine.inflight import Timeouts

    def boom(*a, **k):
        raise ZeroDivisionError("bug in a scenario")
    monkeypatch.setattr(jobrun, "run_suite", boom)  # both jobs' suite step
    with FakeEngine() as eng:
        cfg = config.StressConfig(
            attach=config.AttachConfig(url=eng.url, explicit_facts={"vocab_size": 600}),
            suite=config.SuiteConfig(scenarios=["transitions"],
                                     overrides={"ladder": [1], "repeats": 1, "max_tokens": 4}),
            output=config.OutputConfig(results_dir=tmp_path, run_id="crash"),
            timeouts=Timeouts())
        err = Console(file=open(tmp_path / "err.txt", "w"), width=300)
        out = Console(file=open(tmp_path / "out.txt", "w"))
        if job == "stress":
            code = stress.run_stress(cfg, out, err)
        else:
            code = fuzzjob.run_fuzz(cfg, {"max_examples": 2, "seed": 1}, console=out,
                                    err_console=err)
        err.file.close()
    assert code == 4
    m = load_json(tmp_path / "crash" / "manifest.json")
    assert m["exit_code"] == 4 and m["verdict"] == "error" and m["status"] == "failed"
    assert "ZeroDivisionError: bug in a scenario" in m["reason"]
    assert [s["kind"] for s in m["scenarios"]] == [{"stress": "transitions", "fuzz": "fuzz"}[job]]
    log = tmp_path / "crash" / "harness-error.log"
    assert "Traceback" in log.read_text()
    text = (tmp_path / "err.txt").read_text()
    assert "internal error: ZeroDivisionError" in text and "Traceback" not in text


# -- 3. streams ---------------------------------------------------------------------------------
def test_junit_on_stdout_stays_pure_with_a_plot(runs, tmp_path):
    png = tmp_path / "p.png"
    r = run_cli("report", str(runs / "base"), "--format", "junit", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    root = ET.fromstring(r.stdout)  # the whole of stdout is the XML document
    assert root.tag == "testsuites" and root.get("failures") == "0"
    assert f"plot written to {png}" in r.stderr and png.stat().st_size > 1000
    assert png.stat().st_mode & 0o777 == 0o600  # one permission rule (issue 37)


def test_errors_do_not_end_up_in_redirected_output(tmp_path):
    r = run_cli("report", "/missing", "--format", "junit")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: /missing: not a readable ple-harness manifest")


def test_markdown_on_stdout_equals_summary_md(runs):
    r = run_cli("report", str(runs / "head"), "--format", "markdown")
    assert r.returncode == 1 and r.stderr == ""
    assert r.stdout.startswith("## Test plan and result")


# -- 4. conflicting or ignored options -----------------------------------------------------------
def stress_cli(*args):
    r = run_cli("stress", *args, timeout=60)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    return r


def test_every_launch_option_with_url_is_named_before_the_url_is_tried(tmp_path):
    r = stress_cli("--url", DEAD_URL, "--model", "X", "--tp", "4", "--port", "8000",
                   "--engine-profile", "P", "--results-dir", str(tmp_path))
    assert r.returncode == 2 and r.stdout == ""
    assert "--model, --engine-profile, --tp, --port: launch option(s), but --url attaches" \
        in r.stderr
    assert "no engine answers" not in r.stderr and not list(tmp_path.iterdir())


def test_url_with_reference_engine_names_the_conflict():
    r = stress_cli("--url", DEAD_URL, "--reference", "engine")
    assert r.returncode == 2
    assert "--reference engine needs a launched engine (not --url)" in r.stderr
    assert "no engine answers" not in r.stderr
    r = stress_cli("--url", DEAD_URL, "--reference", "engine", "--engine-arg=--enforce-eager")
    assert r.stderr.startswith("error: 2 problems with the options:")
    for ref, msg in (("bogus", "--reference 'bogus': expected solo, engine, golden or manifest:PATH"),
                     ("manifest:/nope.json", "/nope.json")):
        r = stress_cli("--url", DEAD_URL, "--reference", ref)
        assert r.returncode == 2 and msg in r.stderr and "no engine answers" not in r.stderr


@pytest.mark.parametrize("flag,value,how", [
    ("--block-size", "16", "--engine-arg --block-size=N"),
    ("--chunk-size", "8192", "--engine-arg --max-num-batched-tokens=N"),
    ("--num-speculative-tokens", "3", "--speculative-config"),
    ("--max-num-seqs", "8", "--engine-arg --max-num-seqs=N"),
])
def test_attach_only_facts_with_a_launched_engine_are_refused(flag, value, how, tmp_path):
    r = stress_cli(flag, value, "--results-dir", str(tmp_path))
    assert r.returncode == 2 and not list(tmp_path.iterdir()), "nothing may start"
    assert f"{flag} is for attaching with --url only: it would override the launched engine's " \
           "real value" in r.stderr and how in r.stderr


def test_ladder_errors_blame_the_flag():
    r = stress_cli("--ladder", "0,-2")
    assert r.returncode == 2
    assert r.stderr.startswith("error: --ladder '0,-2': concurrency levels must be between 1 "
                               "and 1024 (got 0, -2)")
    assert "transitions.toml" not in r.stderr
    for flag, value in (("--repeats", "0"), ("--max-tokens", "99999999999999999999")):
        r = stress_cli("--url", DEAD_URL, flag, value)
        assert r.returncode == 2 and f"'{flag}'" in r.stderr and "transitions.toml" not in r.stderr


def test_engine_arg_with_a_space_or_a_separate_value():
    r = stress_cli("--engine-arg", "--max-num-seqs 8")
    assert r.returncode == 2
    assert "--engine-arg '--max-num-seqs 8': one argument holding a space; use the = form: " \
           "--engine-arg --max-num-seqs=8" in r.stderr
    r = stress_cli("--engine-arg", "--max-num-seqs", "8")
    assert r.returncode == 2 and "unexpected extra argument" in r.stderr
    assert "hint: engine arguments take the = form: --engine-arg --max-num-seqs=8" in r.stderr
    # a JSON value with spaces after '=' is fine (not refused for the space)
    r = stress_cli("--engine-arg", '--speculative-config={"method": "ngram"}', "--scenario", "nope")
    assert r.returncode == 2 and "unknown scenario 'nope'" in r.stderr


@pytest.mark.parametrize("url", ["", "ftp://x", "127.0.0.1:8000", "http://"])
def test_url_is_validated(url):
    r = stress_cli("--url", url)
    assert r.returncode == 2
    assert r.stderr.startswith(f"error: --url {url!r}: expected an http:// or https:// URL")


def test_more_malformed_options_are_usage_errors_not_crashes(tmp_path):
    r = stress_cli("--url", "http://[::1")
    assert r.returncode == 2 and "--url 'http://[::1': not a valid URL" in r.stderr
    r = stress_cli("--results-dir", "")
    assert r.returncode == 2 and "--results-dir '': expected a folder path" in r.stderr
    r = run_cli("compare", str(tmp_path), str(tmp_path), "--suite", "")
    assert r.returncode == 2 and "suite file not found" in r.stderr


def test_engine_profile_by_shipped_name(tmp_path):
    # found by name: the run gets past the profile and stops at the (later) scenario check
    r = stress_cli("--engine-profile", "cpu-ngram", "--scenario", "nope")
    assert r.returncode == 2 and "unknown scenario 'nope'" in r.stderr
    r = stress_cli("--engine-profile", "no-such-profile")
    assert r.returncode == 2 and "--engine-profile: unknown engine profile 'no-such-profile' " \
        "(known: cpu-ngram" in r.stderr
    r = stress_cli("--engine-profile", "cpu-ngram", "--control-profile", "no-such-profile")
    assert r.returncode == 2 and "--control-profile: unknown engine profile 'no-such-profile'" \
        in r.stderr
    p = tmp_path / "p.toml"
    p.write_text('engine_args = ["--max-num-seqs 8"]\n')
    r = stress_cli("--engine-profile", str(p))
    assert r.returncode == 2 and f"{p}: engine_args item '--max-num-seqs 8'" in r.stderr


def test_deprecated_repeat_still_works_with_a_warning():
    r = stress_cli("--repeat", "2", "--scenario", "nope")
    assert r.returncode == 2 and "unknown scenario 'nope'" in r.stderr
    assert "warning: --repeat is deprecated: use --suite-repeats" in r.stderr
    r = stress_cli("--repeat", "2", "--suite-repeats", "3")
    assert r.returncode == 2 and "--repeat (deprecated) and --suite-repeats" in r.stderr


# -- 5. reports lead with the why ----------------------------------------------------------------
def test_engine_death_report_prints_the_reason(runs):
    m = load_manifest(runs / "base").model_copy(update={
        "run_id": "died", "status": "engine_died", "verdict": "error", "exit_code": 3,
        "reason": "engine /health no longer answers 200",
        "root_cause": "RuntimeError: Unsupported CPU attention configuration: head_dim=16",
        "engine": EngineRecord(mode="launched", engine_log="engine.log",
                               launcher_log="launcher.log")})
    run_dir = write(runs / "died", m)
    r = run_cli("report", str(run_dir))
    assert r.returncode == 3
    out = r.stdout
    assert "verdict: ERROR (status engine_died, exit 3)" in out
    assert "run engine_died: engine /health no longer answers 200" in out
    assert "root cause (engine log): RuntimeError: Unsupported CPU attention" in out
    assert f"engine log: {run_dir}/engine.log" in out
    # the why comes before the tables
    assert out.index("engine /health no longer answers 200") < out.index("┃ phase")


def test_headline_counts_check_failures(runs):
    m = load_manifest(runs / "head")
    s = m.summary
    assert s.hashes_matched == s.hashes_compared, "all token hashes matched"
    assert (f"{s.hashes_compared}/{s.hashes_compared} token hashes matched their "
            "single-request references; 30 check failure(s) (usage); no independent reference: "
            "a defect that corrupts every run alike passes") in m.summary.headline


def test_summary_md_puts_causes_first(runs):
    from pleharness.render import to_markdown
    m = load_manifest(runs / "base")
    bad = [q for q in m.requests if q.phase == "r1-s1-C2"][1]
    bad.match, bad.first_divergence = False, 3
    bad.note = "n*C + q = 1*256 + 4"
    bad.divergence = Divergence.model_validate(
        {"position": 3, "class": "hard", "fails": True, "margin_nats": 4.0,
         "reference_token": 17, "observed_token": 99, "reconverged": False, "checks_failed": []})
    summarize(m)
    m.verdict, m.exit_code = "fail", 1
    md = to_markdown(m)
    why = md.index("### Why")
    assert why < md.index("### Next steps") < md.index("### Phases") < md.index("### Divergences")
    cause = md[why:].splitlines()[2]
    assert cause == (f"- parity: request {bad.id} (phase r1-s1-C2, C2, prompt {bad.prompt_key}, "
                     f"length {bad.prompt_len}: n*C + q = 1*256 + 4) differs from its reference "
                     "at token position 3 (hard: reference top-1/top-2 margin 4.000 nats; "
                     "expected token 17, got 99)")
    assert "select(.match == false)" in md  # how to see the tokens
    assert md.index("- reproduce") < md.index("### Phases")


def test_reproduce_command_works_as_printed(tmp_path):
    with FakeEngine() as eng:
        r = run_cli("stress", "--url", eng.url, "--results-dir", str(tmp_path), "--run-id",
                    "first", *SMALL, timeout=120)
        assert r.returncode == 0, r.stderr
        md = (tmp_path / "first" / "summary.md").read_text()
        cmd = re.search(r"```bash\n\s*(.+)\n", md).group(1)
        assert "--run-id" not in cmd
        assert "the engine at" in md and "must be running" in md  # attached: said so
        again = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120,
                               cwd=ROOT)
    assert again.returncode == 0, again.stderr[-2000:]
    runs = [p.name for p in tmp_path.iterdir() if (p / "manifest.json").exists()]
    assert len(runs) == 2, "the reproduce command made a second, new run"
    assert shlex.split(cmd)[:3] == [sys.executable, "-m", "pleharness"]


# -- 6. help and README --------------------------------------------------------------------------
def test_stress_help_is_grouped_and_keeps_brackets():
    r = run_cli("stress", "-h")
    assert r.returncode == 0
    for panel in ("Engine (launched by the harness)", "Attach to a running engine (--url)",
                  "Scenarios", "References and verdict", "Timeouts", "Output"):
        assert panel in r.stdout, panel
    assert "[env]" in r.stdout and "--suite-repeats" in r.stdout
    assert "--repeat " not in r.stdout, "the deprecated spelling is hidden"
    assert "<continue|abort>" in r.stdout and "<warm|cold>" in r.stdout
    r = run_cli("compare", "--help")
    assert "[gates]" in r.stdout
    r = run_cli("report", "-h")
    assert "<console|markdown|junit>" in r.stdout
    r = run_cli("report", "RUN", "--format", "xml")
    assert r.returncode == 2 and "'xml' is not one of 'console', 'markdown', 'junit'" in r.stderr


def _ple_commands(markdown: str) -> list[str]:
    """The ``ple-harness`` command lines of a Markdown text's ```bash blocks (comments cut,
    backslash continuations joined) and of its table cells in backticks."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, re.S):
        for ln in block.replace("\\\n", " ").splitlines():
            ln = ln.split(" #")[0].strip()
            if "ple-harness " in ln and not ln.startswith("#"):
                out.append(ln)
    out += [c for c in re.findall(r"\| `([^`|]*ple-harness [^`|]*)` \|", markdown)]
    return out


def _names_only_existing_options(cmds: list[str]) -> None:
    """Each command line's job exists and every --option it gives is in that job's --help."""
    helps = {}
    for ln in cmds:
        args = shlex.split(ln[ln.index("ple-harness "):])[1:]
        sub = args[0]
        if sub.startswith("-"):  # an option of ple-harness itself (--version)
            args, sub = ["", *args], ""
        if sub not in helps:
            r = run_cli(*filter(None, [sub, "--help"]), env={"COLUMNS": "300"})
            assert r.returncode == 0, (ln, r.stderr)
            helps[sub] = r.stdout
        for a in args[1:]:
            if a.startswith("--"):
                assert a.split("=")[0] in helps[sub], (ln, a)


def test_readme_commands_run_as_written():
    """Every command line of the README (set-up, GPU quick start, the jobs table, the CI recipe)
    and of docs/usage.md's common commands parses: its job exists and it names only options
    that job has. The set-up commands and docs/usage.md's use .venv/bin/ple-harness (setup.sh
    does not put ple-harness on PATH)."""
    readme = (ROOT / "README.md").read_text()
    cmds = _ple_commands(readme)
    setup = readme[readme.index("## Set up and run"):readme.index("\n## ", readme.index(
        "## Set up and run") + 5)]
    usage = (ROOT / "docs" / "usage.md").read_text()
    common = _ple_commands(usage[usage.index("## Common commands"):])
    assert len(cmds) >= 15 and len(common) >= 15, (cmds, common)
    for ln in _ple_commands(setup) + common:
        assert re.search(r"(^|&& )\.venv/bin/ple-harness ", ln), ln
    _names_only_existing_options(cmds + common)


def test_readme_jobs_table_is_the_help():
    """Issue 51 item 2: the README's table of jobs is ``ple-harness --help``: every command, in
    its order, with its help's first line word for word, and an example its own --help gives."""
    import typer

    from pleharness.cli import app
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## The jobs"):readme.index("\n## ", readme.index(
        "## The jobs") + 5)]
    rows = re.findall(r"^\| `([\w-]+)` \| (.+?) \| `(.+?)` \|$", section, re.M)
    commands = typer.main.get_command(app).commands
    assert [r[0] for r in rows] == list(commands), "the table lists every job, in --help's order"
    top = run_cli("--help", env={"COLUMNS": "300"}).stdout
    for name, line, example in rows:
        cmd = commands[name]
        assert cmd.help.split("\n\n")[0].strip() == line, name
        assert line in top, name
        assert example.startswith(f"ple-harness {name}") and example in (cmd.epilog or ""), name
        assert example in run_cli(name, "--help", env={"COLUMNS": "300"}).stdout, name


def _yaml_strings(node) -> list[str]:
    """Every string value of a loaded YAML document (a job's run and script lines among them)."""
    if isinstance(node, dict):
        return [s for v in node.values() for s in _yaml_strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _yaml_strings(v)]
    return [node] if isinstance(node, str) else []


def test_docs_ci_commands_name_existing_options():
    """docs/ci.md's jobs (GitHub Actions and GitLab CI): every ple-harness command of their
    steps names a job, only options that job has and a shipped suite; the GitLab jobs run the
    same commands (job, options, suite) as the GitHub ones, which tests/test_ci_premerge.py and
    tests/test_ci_nightly.py run on the CPU engine."""
    import typer
    import yaml

    from pleharness.cli import app
    jobs = set(typer.main.get_command(app).commands)
    text = (ROOT / "docs" / "ci.md").read_text()
    shapes: dict[str, set] = {"github": set(), "gitlab": set()}
    cmds = []
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        doc = yaml.safe_load(block)  # each job definition is valid YAML
        platform = "gitlab" if "gitlab-ci" in block else "github"
        for s in _yaml_strings(doc):
            for ln in s.replace("\\\n", " ").splitlines():
                m = re.search(r"ple-harness (\S+)", ln)
                if m and m.group(1) in jobs:  # not a workflow's name ("ple-harness nightly")
                    cmd = ln[m.start():].split(";")[0].split("||")[0].strip()
                    cmds.append(cmd)
                    args = shlex.split(cmd)
                    suite = args[args.index("--suite") + 1] if "--suite" in args else None
                    shapes[platform].add((args[1], frozenset(a for a in args if
                                                              a.startswith("--")), suite))
    assert len(shapes["gitlab"]) == 4 and len(shapes["github"]) == 5, shapes
    assert shapes["gitlab"] <= shapes["github"], shapes["gitlab"] - shapes["github"]
    _names_only_existing_options(cmds)
    suites = {s for p in shapes.values() for _, _, s in p if s}
    assert suites == {"premerge", "nightly"}
    assert suites <= {p.stem for p in (ROOT / "scenarios" / "suites").glob("*.toml")}


def test_version_names_the_commit_of_a_checkout_else_the_version_alone(monkeypatch):
    """Issue 51 item 4: run from this checkout, --version names its git commit (what an
    editable install runs); with no commit known (no git, a build from an sdist) the version
    alone. The wheel's recorded commit: tests/test_wheel_install.py."""
    import pleharness
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    r = run_cli("--version")
    assert r.returncode == 0
    assert re.fullmatch(rf"ple-harness {re.escape(pleharness.__version__)} \(commit "
                        rf"{head.stdout.strip()}(-dirty)?\)", r.stdout.strip()), r.stdout
    monkeypatch.setattr(pleharness, "source_commit", lambda: None)
    assert pleharness.version_line() == f"ple-harness {pleharness.__version__}"


def test_causes_name_who_classified_a_divergence():
    from pleharness.manifest import RequestRecord
    from pleharness.causes import _failing_divergence
    base = dict(id="r7", scenario="transitions", phase="r1-s2-C3", concurrency=3,
                prompt_key="p0-len5", prompt_len=5, prompt_hash="h", max_tokens=32, match=False)
    d = {"position": 5, "class": "hard", "fails": True, "margin_nats": 1.737,
         "reference_token": 294, "observed_token": 295, "classified_by": "golden",
         "golden_gap_nats": 2.5, "observed_in_golden_top": True, "threshold_nats": 0.5}
    line = _failing_divergence(RequestRecord(**base, divergence=d))
    assert "(hard: golden model: gap 2.500 nats (threshold 0.5); reference top-1/top-2 margin " \
           "1.737 nats; expected token 294, got 295)" in line
    line = _failing_divergence(RequestRecord(**base, divergence={**d, "observed_in_golden_top":
                                                                  False}))
    assert "golden model: observed token not in its top candidates" in line
    assert _failing_divergence(RequestRecord(**base, divergence={**d, "fails": False})) is None


def test_piped_help_keeps_option_names_whole():
    """--help piped without COLUMNS (a new user's `ple-harness stress --help | less`): 120
    columns, not rich's 80 at which option names were cut ("--reference-engi…")."""
    import os
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    out = subprocess.run([sys.executable, "-m", "pleharness", "stress", "--help"],
                         capture_output=True, text=True, env=env, timeout=120).stdout
    for name in ("--reference-engine-arg", "--reference-drop-arg", "--reference-cache-state",
                 "--no-engine-probe", "PLE_HARNESS_ENGINE_PROBE"):
        assert name in out, name


def test_confirm_runs_has_one_default_for_every_command():
    """Issue 34 item 2: --confirm-runs of stress, fuzz and explain, StressConfig and explain()
    all take pleharness.defaults.DEFAULT_CONFIRM_RUNS (it was written in six places)."""
    import inspect

    import typer

    from pleharness.cli import app
    from pleharness.config import StressConfig
    from pleharness.defaults import DEFAULT_CONFIRM_RUNS
    from pleharness.explain import explain
    cmd = typer.main.get_command(app)
    for name in ("stress", "fuzz", "explain"):
        (opt,) = [p for p in cmd.commands[name].params if p.name == "confirm_runs"]
        assert opt.default == DEFAULT_CONFIRM_RUNS, name
        assert f"reproduced {DEFAULT_CONFIRM_RUNS}/{DEFAULT_CONFIRM_RUNS}" in opt.help, name
    assert StressConfig().confirmation.runs == DEFAULT_CONFIRM_RUNS
    assert inspect.signature(explain).parameters["confirm_runs"].default == DEFAULT_CONFIRM_RUNS


def test_stress_option_defaults_are_the_config_groups_defaults(monkeypatch):
    """Issue 34 item 2, one default per option: each `stress` option (its default read from
    click's params) defaults to the config group field it fills (both read
    pleharness.defaults), and the config the builders make of the defaults alone is the
    groups' defaults. The one difference by design: --api defaults to both, the commands
    without --api send completions."""
    import typer

    from pleharness.cli import app
    from pleharness.cli.assemble import stress_config
    from pleharness.config import StressConfig
    params = {p.name: p.default for p in typer.main.get_command(app).commands["stress"].params}
    opt = {k: getattr(v, "value", v) for k, v in params.items()}  # enum choices: their value
    base = StressConfig()
    e, s, r, v, t, c = (base.engine, base.suite, base.reference, base.verdict, base.timeouts,
                        base.confirmation)
    fills = {"start_timeout": e.start_timeout_s, "engine_probe": e.probe, "model": e.model,
             "port": e.port, "url": base.attach.url, "suite_repeats": s.repeat,
             "logprobs": s.logprobs, "reference": r.source, "reference_cache_state": r.cache_state,
             "golden_model": r.golden_model, "near_tie_nats": v.near_tie_nats,
             "strict": v.strict, "golden": v.golden, "on_timeout": v.on_timeout,
             "connect_timeout": t.connect_s, "first_token_timeout": t.first_token_s,
             "between_tokens_timeout": t.between_tokens_s, "request_timeout": t.total_s,
             "results_dir": str(base.output.results_dir), "run_id": base.output.run_id,
             "confirm_runs": c.runs, "parallel_engines": str(c.parallel_engines)}
    assert {k: opt[k] for k in fills} == fills
    assert (opt["api"], s.api) == ("both", "completions")
    monkeypatch.setattr("sys.argv", ["ple-harness", "stress"])
    built = stress_config(**default_stress_options(reference=opt["reference"]))
    assert built.suite == type(s)(api="both")
    for group in ("engine", "attach", "reference", "control", "verdict", "timeouts",
                  "confirmation"):
        assert getattr(built, group) == getattr(base, group), group
    assert (built.output.results_dir, built.output.run_id) == (base.output.results_dir, None)


def test_a_selftest_pass_says_how_to_reproduce_it_and_where_its_engine_log_is(tmp_path):
    """Found by a new user (fresh-clone run): a selftest pass's summary.md pointed at the fault
    proxy for the engine log, at results/<pass> for the tokens (the pass lives in the selftest's
    folder) and gave a reproduce command with the pass marker as an argument (exit 2)."""
    from pleharness.manifest import Manifest
    from pleharness.render.text import next_steps, reproduce_command
    m = Manifest(run_id="01-flip_under_load",
                 invocation=["ple-harness", "selftest", "--results-dir", "res",
                             "(selftest pass flip_under_load)"],
                 engine={"mode": "attached", "url": "http://127.0.0.1:40643"})
    assert reproduce_command(m) == "ple-harness selftest --results-dir res --fault flip_under_load"
    m.invocation = ["ple-harness", "selftest", "--fault", "flip_under_load",
                    "(selftest pass flip_under_load)"]
    assert reproduce_command(m) == "ple-harness selftest --fault flip_under_load"
    m.invocation = ["ple-harness", "selftest", "(selftest pass clean)"]
    assert reproduce_command(m) == "ple-harness selftest"
    d = str(tmp_path / "res" / "sid" / "01-flip_under_load")
    (log,) = [t for t, _ in next_steps(m, d) if t.startswith("engine log")]
    assert log.startswith(f"engine log: {d}/../engine.log") and "40643" not in log


def test_facts_refuses_an_empty_results_dir():
    # an empty --results-dir was read as "." and the log folder made in the current directory
    r = run_cli("facts", "--results-dir", "", "--model", "/nonexistent/model", timeout=60)
    assert r.returncode == 2 and "--results-dir '': expected a folder path" in r.stderr
