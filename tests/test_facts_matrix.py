"""Issue 48: every shipped suite and profile planned on a matrix of engine facts users really
serve, without an engine (pleharness/run/dryrun.py: each kind's own run() against a synthetic
engine with those facts). Each cell: no kind raises (no usage error once the engine started), no
request that would not fit max_model_len or the vocabulary, the load phases recorded (run or left
out) add up to the phases planned, the requests stay within the suite's stated bound, and every
phase left out or vacuous names its reason. docs/gpu-quickstart.md describes the matrix.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pleharness.config import DEFAULT_SCENARIOS
from pleharness.engine.facts import gather_facts
from pleharness.planning import facts_of, load_plan_facts, plan_suite
from pleharness.run.dryrun import Assumptions, plan_scenario
from pleharness.scenarios import load_scenarios
from pleharness.suites import load_suite

ROOT = Path(__file__).resolve().parent.parent

# the requests of one repeat a suite may plan on any cell (an engine-time budget): the default
# suite has no concurrency derived from the engine; capture_edges (premerge, nightly) runs up to
# its max_levels levels of up to max_num_seqs + 1 requests in flight (vLLM's GPU default
# max_num_seqs is 1024, so up to 1025)
BOUND = {"default": 1_500, "selftest": 400, "selftest-families": 1_500,
         "premerge": 1_500 + 6 * 1_025, "nightly": 2_500 + 16 * 1_025}


def suite_scenarios(name: str):
    """(scenarios, repeat) of a shipped suite; ``default``: the stress default."""
    if name == "default":
        return load_scenarios(list(DEFAULT_SCENARIOS), {}), 1
    s = load_suite(name)
    return load_scenarios(s.scenario_refs(), {}), s.repeat


SUITES = {name: suite_scenarios(name) for name in BOUND}

# vLLM's CUDA-graph capture sizes on a GPU by default (up to 512), none on a CPU
GPU_SIZES = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, 513, 16))
SPEC = [(None, 0)] + [(m, k) for m in ("ngram", "eagle", "mtp") for k in range(1, 6)]
DIMS = {
    "max_model_len": [512, 1024, 2048, 4096, 8192, 32768, 131072],
    "max_num_batched_tokens": [256, 512, 2048, 8192, 16384],
    "block": [16, 32, 64, 128, 256, "hybrid"],
    "spec": SPEC,
    "prefix_caching": [True, False],
    "tensor_parallel_size": [1, 2, 4, 8],
    "vocab_size": [1024, 32000, 128256, 151936, 262144],
    "chat_template": [True, False],
    "max_num_seqs": [2, 8, 256, 1024],
    "structured_outputs": [True, False],
    "outputs": ["healthy", "cut_short"],
}
STEP = {d: s for d, s in zip(DIMS, (1, 3, 5, 7, 1, 3, 2, 1, 3, 1, 1))}


def cell(i: int) -> tuple[str, dict, Assumptions]:
    """Cell ``i`` of the covering matrix: dimension d takes its value number (i * STEP[d] + i //
    len) mod len, so that every value of every dimension appears and the pairs vary."""
    pick = {d: v[(i * STEP[d] + i // len(v)) % len(v)] for d, v in DIMS.items()}
    method, k = pick["spec"]
    values = {"max_model_len": pick["max_model_len"],
              "max_num_batched_tokens": pick["max_num_batched_tokens"],
              "num_speculative_tokens": k, "speculative_method": method,
              "prefix_caching": pick["prefix_caching"],
              "tensor_parallel_size": pick["tensor_parallel_size"],
              "vocab_size": pick["vocab_size"], "max_num_seqs": pick["max_num_seqs"],
              "cudagraph_capture_sizes": GPU_SIZES, "device_type": "cuda",
              "dtype": "bfloat16"}
    if pick["block"] == "hybrid":  # a hybrid model: attention block 80, mamba block 2048
        values.update(block_size=80, effective_attention_block_size=80, mamba_block_size=2048,
                      cache_hit_alignment_tokens=2048)
    else:
        values["block_size"] = pick["block"]
    assume = Assumptions(outputs=pick["outputs"], chat_template=pick["chat_template"],
                         structured_outputs=pick["structured_outputs"])
    name = (f"M{values['max_model_len']}-C{values['max_num_batched_tokens']}-B{pick['block']}-"
            f"{method or 'nospec'}{k or ''}-pc{int(pick['prefix_caching'])}-"
            f"tp{values['tensor_parallel_size']}-V{values['vocab_size']}-"
            f"seqs{values['max_num_seqs']}-{'chat' if assume.chat_template else 'nochat'}-"
            f"{'so' if assume.structured_outputs else 'noso'}-{assume.outputs}")
    return name, values, assume


MATRIX = [cell(i) for i in range(48)]
# the engines issue 48 names: a bf16 GPU engine with --max-model-len 2048 and vLLM's default
# chunk budget (8192) with ngram speculative decoding; the CPU engine with --max-model-len 256
# and a chunk budget above it; the CPU engine (cpu-ngram profile) behind a fault that cuts every
# output short; unknown facts (attached without flags)
NAMED = [
    ("issue48-gpu-M2048-C8192-ngram", {
        "max_model_len": 2048, "max_num_batched_tokens": 8192, "block_size": 16,
        "num_speculative_tokens": 3, "speculative_method": "ngram", "prefix_caching": True,
        "vocab_size": 151936, "max_num_seqs": 1024, "cudagraph_capture_sizes": GPU_SIZES,
        "device_type": "cuda"}, Assumptions()),
    ("issue48-cpu-M256-C512", {
        "max_model_len": 256, "max_num_batched_tokens": 512, "block_size": 32,
        "num_speculative_tokens": 3, "speculative_method": "ngram", "prefix_caching": True,
        "vocab_size": 1024, "max_num_seqs": 8, "cudagraph_capture_sizes": [],
        "device_type": "cpu"}, Assumptions()),
    ("issue48-cpu-cut-short", {
        "max_model_len": 1024, "max_num_batched_tokens": 256, "block_size": 32,
        "num_speculative_tokens": 3, "speculative_method": "ngram", "prefix_caching": True,
        "vocab_size": 1024, "max_num_seqs": 8, "cudagraph_capture_sizes": [],
        "device_type": "cpu"}, Assumptions(outputs="cut_short")),
    ("unknown-facts", {}, Assumptions(prefix_cache_reset=False)),
]

# vLLM's GPU defaults a profile leaves to the engine, and the model each example profile is for
GPU_DEFAULTS = {"block_size": 16, "max_num_batched_tokens": 8192, "max_num_seqs": 1024,
                "cudagraph_capture_sizes": GPU_SIZES, "device_type": "cuda"}
PROFILE_MODELS = {
    "cpu-ngram": {"cudagraph_capture_sizes": [], "device_type": "cpu"},
    "gpu-h200-default": GPU_DEFAULTS | {"block_size": 32, "max_num_batched_tokens": 256},
    "gpu-h200-ngram": GPU_DEFAULTS | {"block_size": 32},
    "gpu-h200-ngram-k2": GPU_DEFAULTS | {"block_size": 32},
    # a dense 8B model (Llama-3.1-8B: 128256 IDs, 131072 tokens)
    "gpu-dense-bf16.example": GPU_DEFAULTS | {"vocab_size": 128256, "max_model_len": 131072},
    "gpu-dense-bf16-ngram.example": GPU_DEFAULTS | {"vocab_size": 128256,
                                                    "max_model_len": 131072},
    # a mixture-of-experts model (Qwen3-30B-A3B: 151936 IDs, 40960 tokens)
    "gpu-moe-bf16-tp4.example": GPU_DEFAULTS | {"vocab_size": 151936, "max_model_len": 40960},
    # a mixture-of-experts model with an MTP head (DeepSeek-V3's vocabulary)
    "gpu-tp4-mtp.example": GPU_DEFAULTS | {"vocab_size": 129280},
}
PROFILES = sorted(p.name[:-len(".toml")] for p in (ROOT / "profiles").glob("*.toml"))


def profile_cell(name: str) -> tuple[str, dict, Assumptions]:
    """A profile's planned facts: its launch arguments (as the harness observes them) and the
    model and vLLM defaults of :data:`PROFILE_MODELS`, which the launch arguments override."""
    f, assume, _ = load_plan_facts(ROOT / "profiles" / f"{name}.toml")
    return f"profile-{name}", {**PROFILE_MODELS[name], **f.values}, assume


def plan_cell(values: dict, assume: Assumptions, suite: str, cache: dict):
    """The suite's plan on a cell, each distinct (scenario, params) planned once per cell."""
    scs, repeat = SUITES[suite]
    facts = facts_of(values)
    plans = []
    for sc in scs:
        key = (type(sc).__qualname__, sc.name,
               json.dumps(sc.params.model_dump(), sort_keys=True, default=str))
        if key not in cache:
            cache[key] = plan_scenario(sc, facts, assume)
        plans.append(cache[key])
    plan = plan_suite([], facts, assume, repeat)
    plan.plans = plans
    return plan


def check_cell(name: str, values: dict, assume: Assumptions) -> dict[str, list[str]]:
    """Assert the cell (module docstring) for every suite; returns {suite: vacuous phases}."""
    cache: dict = {}
    out = {}
    for suite in BOUND:
        plan = plan_cell(values, assume, suite, cache)
        assert plan.problems == [], f"{name}, suite {suite}:\n" + "\n".join(plan.problems)
        assert plan.requests <= BOUND[suite], (
            f"{name}, suite {suite}: {plan.requests} requests planned, bound {BOUND[suite]}")
        vac = [f"{p.name}/{ph.name}: {ph.vacuous}" for p in plan.plans for ph in p.phases
               if ph.vacuous]
        assert all(v.split(": ", 1)[1].strip() for v in vac), f"{name}: a reason is empty"
        out[suite] = vac
    return out


@pytest.mark.parametrize("name,values,assume", MATRIX + NAMED, ids=lambda x: x
                         if isinstance(x, str) else "")
def test_every_suite_plans_on_the_cell(name, values, assume):
    check_cell(name, values, assume)


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_plans_every_suite(profile):
    assert profile in PROFILE_MODELS, f"profile {profile}: add its model's facts to the matrix"
    check_cell(*profile_cell(profile))


def test_the_matrix_covers_what_users_serve():
    """Every value of every dimension is in some cell, and cells differ."""
    for d, vals in DIMS.items():
        seen = {json.dumps(cell(i)[1].get(d, None), default=str) for i in range(len(MATRIX))}
        if d in ("block", "spec", "chat_template", "structured_outputs", "outputs"):
            continue  # encoded in the cell's values or assumptions: the names below show them
        assert {json.dumps(v) for v in vals} <= seen, d
    names = [c[0] for c in MATRIX]
    assert len(set(names)) == len(names)
    for tag in ("Bhybrid", "B16-", "B256-", "nospec", "ngram5", "eagle1", "mtp3", "pc0", "tp8",
                "V1024-", "V262144", "nochat", "noso", "cut_short", "seqs2-"):
        assert any(tag in n for n in names), tag
    # chunk budgets above max_model_len are in the matrix
    assert any(v["max_num_batched_tokens"] > v["max_model_len"] for _, v, _ in MATRIX)


def test_the_issue_cell_is_vacuous_with_its_reasons_not_a_usage_error():
    """The GPU engine of issue 48 (--max-model-len 2048, vLLM's default chunk budget 8192):
    prompt_logprobs runs its short prompt and says why nothing is chunked; boundary's n*C + q
    family and the pairs that need a chunk are named; nothing raises."""
    name, values, assume = NAMED[0]
    vac = check_cell(name, values, assume)["default"]
    assert any(v.startswith("prompt_logprobs/prompt-logprobs-c4: chunked prefill not exercised: "
                            "the chunk budget C = 8192 is not below max_model_len 2048")
               for v in vac), vac
    assert any(v.startswith("boundary/boundary-cold: n*C + q lengths not tested") for v in vac)
    assert sum(v.startswith("pairs/") for v in vac) == 3, vac


def test_cpu_short_context_and_cut_short_outputs():
    """The two CPU engines of "done when": max_model_len 256 with a chunk budget above it, and
    every output cut short (mixed_params leaves out the variants its short default outputs
    cannot build, naming the finding; nothing raises)."""
    vac = check_cell(*NAMED[1])["default"]
    assert any("prompt-logprobs-c4: chunked prefill not exercised" in v for v in vac)
    cache: dict = {}
    plan = plan_cell(NAMED[2][1], NAMED[2][2], "default", cache)
    mixed = next(p for p in plan.plans if p.name == "mixed_params")
    assert any("variant 'stop-token' left out: its prompt's default output has 8 token(s) of "
               "the 16 asked with ignore_eos: cut short, a finding of the default request's "
               "checks: no token at position 8" in n for n in mixed.notes), mixed.notes


@pytest.mark.parametrize("change,assume,phase,reason", [
    ({"prefix_caching": False}, Assumptions(), "prefix_isolation/isolation-near-duplicates",
     "prefix caching is off"),
    ({}, Assumptions(chat_template=False), "chat_api/chat-api-solo", "no chat template"),
    ({}, Assumptions(structured_outputs=False), "constrained/constrained-c4",
     "the engine refused structured_outputs"),
    ({"max_num_seqs": 2}, Assumptions(), "transitions/r1-s1-C4",
     "C4 is above max_num_seqs 2"),
])
def test_what_cannot_fit_is_left_out_with_its_reason(change, assume, phase, reason):
    values = {**NAMED[0][1], **change}
    vac = check_cell("changed", values, assume)["default"]
    assert any(v.startswith(phase + ": ") and reason in v for v in vac), vac


def test_the_tp4_profile_plans_the_headline_run():
    """docs/gpu-quickstart.md's GPU box: `ple-harness stress --tp 4` (the default suite) on the TP 4
    profile plans every phase, none left out; so does the embedded model launched with --tp 4
    on a GPU (its launch arguments, vLLM's GPU capture sizes)."""
    from pleharness.engine.session import EMBEDDED_ENGINE_ARGS
    from pleharness.model import SHIPPED_DIR
    name, values, assume = profile_cell("gpu-tp4-mtp.example")
    assert values["tensor_parallel_size"] == 4 and values["num_speculative_tokens"] == 3
    embedded = gather_facts(engine_args=EMBEDDED_ENGINE_ARGS, launched=True, tp=4,
                            model_path=str(SHIPPED_DIR)).values
    assert embedded["tensor_parallel_size"] == 4 and embedded["max_model_len"] == 1024
    for vals in (values, {**GPU_DEFAULTS, **embedded}):
        plan = plan_cell(vals, assume, "default", {})
        assert plan.problems == [] and plan.planned == 43
        assert plan.planned == len([ph for p in plan.plans for ph in p.load])
        assert not [ph for p in plan.plans for ph in p.load if ph.status == "left out"]


def test_a_kind_that_raises_fails_the_cell():
    """The matrix fails when a kind raises on a cell (the shape of issue 48's usage error)."""
    from pleharness.scenarios.base import ScenarioError
    from pleharness.scenarios.prompt_logprobs import PromptLogprobs

    class Raising(PromptLogprobs):
        def run(self, ctx):
            raise ScenarioError("a 8229-token prompt + max_tokens 8 exceeds max_model_len 2048")

    sc = Raising("prompt_logprobs", PromptLogprobs.Params(), "x.toml")
    plan = plan_suite([sc], facts_of(NAMED[0][1]))
    assert plan.problems == ["prompt_logprobs: the prompt_logprobs kind raised ScenarioError: "
                             "a 8229-token prompt + max_tokens 8 exceeds max_model_len 2048",
                             "prompt_logprobs: 0 load phases recorded, 1 planned"]
    with pytest.raises(AssertionError, match="kind raised ScenarioError"):
        SUITES["one"] = ([sc], 1)
        BOUND["one"] = 10
        try:
            check_cell("raising", NAMED[0][1], Assumptions())
        finally:
            del SUITES["one"], BOUND["one"]


def test_profile_facts_come_from_the_launch_arguments():
    f, _, what = load_plan_facts(ROOT / "profiles" / "gpu-tp4-mtp.example.toml")
    assert (f.max_model_len, f.max_num_batched_tokens, f.block_size, f.num_speculative_tokens,
            f.speculative_method, f.tensor_parallel_size) == (32768, 8192, 16, 3, "mtp", 4)
    cpu = gather_facts(engine_args=["--max-model-len", "256"], launched=True)
    assert cpu.max_model_len == 256 and cpu.num_speculative_tokens == 0


def test_kinds_shorten_what_does_not_fit_and_say_so():
    """insert counts to fewer numbers, stop_strings lowers its count, boundary without a chat
    template sends token-ID prompts without the expected-text check; each is said in a note."""
    from pleharness.run.dryrun import PlanRun
    from pleharness.scenarios import load_scenario_file
    small = {"max_model_len": 128, "vocab_size": 1024, "block_size": 32,
             "max_num_batched_tokens": 256, "num_speculative_tokens": 0}
    ins = plan_scenario(load_scenario_file("insert"), small)
    assert ins.error is None and not ins.vacuous
    assert any("the decode counts to" in n and "not 300" in n for n in ins.notes), ins.notes
    stop = plan_scenario(load_scenario_file("stop_strings"), small | {"max_model_len": 64})
    assert stop.error is None and stop.load[0].prompt_lens[1] + 32 <= 64
    run = PlanRun(small | {"max_model_len": 1024}, "boundary", Assumptions(chat_template=False))
    load_scenario_file("boundary").run(run.scenario_view)
    specs = [r for r in run.manifest.requests if r.phase == "boundary-cold"]
    assert specs and all(r.prompt_key.startswith("raw-len") for r in specs)
    assert any("chat-shaped prompts not made" in n and "no chat template" in n
               for n in run.plan.notes), run.plan.notes


def test_scenarios_check_plans_on_a_facts_file_or_a_manifest(tmp_path):
    """`ple-harness scenarios --check premerge --facts FILE` prints the plan and exits 0; a file
    with no facts is a usage error (2), nothing planned."""
    from conftest import run_cli
    from pleharness.manifest import Manifest, write_manifest
    m = Manifest(run_id="r1")
    m.facts = facts_of(NAMED[0][1]).to_dict()
    m.engine.mode = "attached"
    (tmp_path / "run").mkdir()
    write_manifest(tmp_path / "run" / "manifest.json", m)
    r = run_cli("scenarios", "--check", "premerge", "--facts", str(tmp_path / "run"),
                timeout=300)
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "suite premerge: plan on manifest" in out and "M 2048" in out and "C 8192" in out
    assert ("prompt-logprobs-c4 (C4): 7 requests, prompts 24..160 tokens, max_tokens up to 8; "
            "VACUOUS: chunked prefill not exercised") in out
    assert "prefix-cache reset no" in out  # an attached engine
    assert "no usage error" in out and "PROBLEMS" not in out
    (tmp_path / "bad.json").write_text("{}")
    r = run_cli("scenarios", "--facts", str(tmp_path / "bad.json"), timeout=300)
    assert r.returncode == 2 and "no 'facts' in it" in " ".join(r.stderr.split())
