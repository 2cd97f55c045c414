import json

import pytest

from pleharness.errors import UsageError
from pleharness.engine.fact_sources import parse_engine_args
from pleharness.engine.facts import gather_facts
from pleharness.engine.metrics import delta, parse_counters
from pleharness.profile import load_profile
from pleharness.scenarios.shared.lengths import boundary_lengths
from pleharness.scenarios.pairs import derive_pairs

SPEC = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2}'


def test_parse_engine_args_forms_and_override():
    a = parse_engine_args(["--block-size", "32", "--max-num-batched-tokens=256", "--enforce-eager",
                           "--block-size=64"])
    assert a == {"--block-size": "64", "--max-num-batched-tokens": "256", "--enforce-eager": True}


def test_facts_from_launch_args_and_sources():
    f = gather_facts(engine_args=["--block-size", "32", "--max-num-batched-tokens", "256",
                                  "--speculative-config", SPEC], launched=True, tp=1,
                     model_card={"max_model_len": 1024})
    assert f.get("block_size") == 32 and f.get("max_num_batched_tokens") == 256
    assert f.get("num_speculative_tokens") == 3 and f.q == 4
    assert f.get("max_model_len") == 1024
    assert f.get("prefix_caching") is True
    d = f.to_dict()
    assert d["num_speculative_tokens"]["source"] == "launch argument --speculative-config"
    assert d["max_model_len"]["source"] == "/v1/models"
    assert d["vocab_size"] == {"value": None, "source": "unknown"}


def test_explicit_flags_win_and_attach_has_no_k_default():
    f = gather_facts(explicit={"block_size": 16}, engine_args=["--block-size", "32"], launched=True)
    assert f.get("block_size") == 16 and f.sources["block_size"] == "command-line flag"
    g = gather_facts(engine_args=None, launched=False)
    assert g.get("num_speculative_tokens") is None and g.q == 1


def test_vocab_from_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 1024,
                                                      "max_position_embeddings": 2048}))
    f = gather_facts(model_path=str(tmp_path), model_card={"max_model_len": 1024})
    assert f.get("vocab_size") == 1024
    assert f.get("max_model_len") == 1024  # /v1/models comes before config.json


def test_boundary_lengths_formulas_controls_and_merge():
    facts = {"num_speculative_tokens": 3, "block_size": 32, "max_num_batched_tokens": 64}
    lengths, notes = boundary_lengths(facts, depth=2, controls=True, max_len=200)
    got = {b.length: b for b in lengths}
    # q=4; n*B+q = 36, 68; n*C+q = 68, 132; controls +-1
    assert sorted(got) == [3, 4, 5, 35, 36, 37, 67, 68, 69, 131, 132, 133]
    assert got[68].reasons == ["n*B + q = 2*32 + 4", "n*C + q = 1*64 + 4"]
    assert not got[68].control and got[67].control
    assert notes == []
    short, notes = boundary_lengths(facts, depth=2, max_len=100)
    assert max(b.length for b in short) == 69
    assert any("L=132" in n for n in notes)


def test_boundary_lengths_unknown_facts_are_said():
    lengths, notes = boundary_lengths({}, depth=3, controls=False)
    assert [b.length for b in lengths] == [1]
    assert any("block size unknown" in n for n in notes)
    assert any("max_num_batched_tokens unknown" in n for n in notes)


def test_derive_pairs():
    pairs, notes = derive_pairs({"num_speculative_tokens": 3, "max_num_batched_tokens": 256},
                                max_len=1000)
    assert [(a, b) for _, a, b in pairs] == [(260, 516), (260, 512), (4, 516), (999, 998)]
    pairs, notes = derive_pairs({"max_num_batched_tokens": 256}, max_len=300)
    assert [(a, b) for _, a, b in pairs] == [(299, 298)]
    assert len(notes) == 3


def test_metrics_parsing():
    text = ('# HELP vllm:prefix_cache_hits Prefix cache hits, in tokens\n'
            '# TYPE vllm:prefix_cache_hits counter\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 96.0\n'
            'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 4.0\n'
            'vllm:num_requests_running{engine="0"} 1.0\n')
    c = parse_counters(text)
    assert c["vllm:prefix_cache_hits"] == 100.0
    assert "vllm:num_requests_running" not in c
    assert delta({"vllm:prefix_cache_hits": 60.0}, c, "vllm:prefix_cache_hits") == 40.0
    assert delta(None, c, "vllm:prefix_cache_hits") is None


def test_profile_loading(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text('tp = 2\nengine_args = ["--block-size", "32"]\n[env]\nA = "1"\n')
    prof = load_profile(p)
    assert prof.tp == 2 and prof.engine_args == ["--block-size", "32"] and prof.env == {"A": "1"}
    p.write_text('tp = 0\nengin_args = []\n')
    with pytest.raises(UsageError) as e:
        load_profile(p)
    assert str(e.value) == (f"{p}: tp: Input should be greater than or equal to 1; engin_args: "
                            "unknown key (allowed: model, python, tp, served_model_name, host, "
                            "engine_args, env)")


def test_shipped_profiles_load():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "profiles"
    cpu = load_profile(root / "cpu-ngram.toml")
    assert "--speculative-config" in cpu.engine_args
    f = gather_facts(engine_args=cpu.engine_args, launched=True)
    assert f.q == 4 and f.get("max_num_batched_tokens") == 256
    gpu = load_profile(root / "gpu-tp4-mtp.example.toml")
    assert gpu.tp == 4


def test_launch_command_tp_and_redaction():
    from pleharness.engine.launch import LaunchSpec, redact_env
    spec = LaunchSpec(model="/m", python="/py", tp=4, engine_args=["--block-size", "16"],
                      served_model_name="m")
    cmd = spec.command(8000)
    assert cmd[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "4"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[-2:] == ["--block-size", "16"]
    assert "--tensor-parallel-size" not in LaunchSpec(model="/m", python="/py").command(1)
    env = redact_env({"HF_TOKEN": "x", "MY_API_KEY": "y", "DB_PASSWORD": "z", "SECRET_V": "w",
                      "NCCL_NVLS_ENABLE": "0"})
    assert env == {"HF_TOKEN": "<redacted>", "MY_API_KEY": "<redacted>", "DB_PASSWORD": "<redacted>",
                   "SECRET_V": "<redacted>", "NCCL_NVLS_ENABLE": "0"}
    # the embedded model's heads divide by tensor-parallel sizes 1, 2 and 4
    import re
    from pathlib import Path
    src = (Path(__file__).resolve().parent.parent / "pleharness/model/build_tiny.py").read_text()
    heads = int(re.search(r"num_attention_heads=(\d+)", src).group(1))
    kv = int(re.search(r"num_key_value_heads=(\d+)", src).group(1))
    assert heads % 4 == 0 and kv % 4 == 0


# -- issue 14: facts from the engine itself ------------------------------------------------------
# /metrics and log excerpts in the formats of vLLM 0.32 (CPU, measured) and 0.26 (GPU, from
# docs/gpu-runs/*/engine-highlights.log)
CACHE_INFO = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
              '# TYPE vllm:cache_config_info gauge\n'
              'vllm:cache_config_info{block_size="128",cache_dtype="auto",'
              'cache_hit_alignment_tokens="128",effective_attention_block_size="128",'
              'enable_prefix_caching="True",engine="0",kv_cache_size_tokens="262144",'
              'mamba_block_size="None",num_gpu_blocks="2048",sliding_window="None"} 1.0\n'
              '# HELP vllm:num_preemptions Cumulative number of preemption from the engine.\n'
              '# TYPE vllm:num_preemptions counter\n'
              'vllm:num_preemptions_total{engine="0",model_name="m"} 3.0\n')
LOG_026 = ("(EngineCore pid=1153) INFO 11-29 18:27:37 [core.py:116] Initializing a V1 LLM engine "
           "(v0.26.0) with config: model='/m', speculative_config=SpeculativeConfig(method='ngram',"
           " model=None, num_spec_tokens=3), tokenizer='/m', dtype=torch.bfloat16, max_seq_len=1024,"
           " tensor_parallel_size=2, kv_cache_dtype=auto, enforce_eager=False, seed=0, "
           "enable_prefix_caching=True, compilation_config={'mode': 3, 'cudagraph_mode': "
           "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'cudagraph_capture_sizes': [4, 1, 2, 8],"
           " 'max_cudagraph_capture_size': 8}\n"
           "(EngineCore pid=1153) INFO [scheduler.py:1] Chunked prefill is enabled with "
           "max_num_batched_tokens=8192.\n"
           "(EngineCore pid=1153) INFO [kv_cache_utils.py:1] GPU KV cache size: 262,144 tokens\n")


def test_engine_sources_parse():
    from pleharness.engine.fact_sources import log_observations, metrics_observations
    m = metrics_observations(CACHE_INFO)
    assert m["block_size"] == "128" and m["kv_cache_size_tokens"] == "262144"
    assert m["prefix_caching"] == "True" and m["kv_cache_dtype"] == "auto"
    assert metrics_observations("vllm:other 1.0\n") == {}
    lg = log_observations(LOG_026)
    assert lg["num_speculative_tokens"] == 3 and lg["speculative_method"] == "ngram"
    assert lg["dtype"] == "torch.bfloat16" and lg["kv_cache_dtype"] == "auto"
    assert lg["cudagraph_capture_sizes"] == [4, 1, 2, 8]
    assert lg["cudagraph_mode"].endswith("FULL_AND_PIECEWISE")
    assert lg["max_num_batched_tokens"] == "8192" and lg["kv_cache_size_tokens"] == "262144"
    assert lg["max_model_len"] == "1024" and lg["tensor_parallel_size"] == "2"
    none = log_observations("x with config: model='/m', speculative_config=None, dtype=float32,")
    assert none["num_speculative_tokens"] == 0 and none["dtype"] == "float32"


class _Resp:
    def __init__(self, code, body=None):
        self.status_code, self._body = code, body

    def json(self):
        return self._body


class _FakeClient:
    """Stands in for EngineClient: /metrics text and /server_info answers."""
    base_url = "http://x"

    def __init__(self, metrics, server_info=None):
        self._m, self._si = metrics, server_info
        outer = self

        class S:
            def get(self, url, params=None, timeout=None):
                return _Resp(200, outer._si) if outer._si is not None else _Resp(404)
        self.session = S()

    def metrics_text(self):
        return self._m


def test_engine_facts_win_over_flags_and_conflicts_are_recorded(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(LOG_026)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 500, "torch_dtype": "float16",
                                                      "max_position_embeddings": 2048}))
    info = {"vllm_config": {"scheduler_config": {"max_num_batched_tokens": 8192,
                                                 "max_num_seqs": 256},
                            "speculative_config": {"method": "ngram",
                                                   "num_speculative_tokens": 3},
                            "compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE",
                                                   "cudagraph_capture_sizes": [1, 2, 4, 8]}}}
    f = gather_facts(explicit={"block_size": 16}, client=_FakeClient(CACHE_INFO, info),
                     engine_log=log, model_card={"max_model_len": 1024}, model_path=str(tmp_path))
    assert f.get("block_size") == 128 and f.sources["block_size"].startswith("/metrics")
    assert f.get("max_num_batched_tokens") == 8192
    assert f.sources["max_num_batched_tokens"].startswith("/server_info")
    assert f.get("max_num_seqs") == 256 and f.get("kv_cache_size_tokens") == 262144
    assert f.get("cudagraph_capture_sizes") == [1, 2, 4, 8]
    assert f.get("cudagraph_mode") == "FULL_AND_PIECEWISE"
    assert f.get("num_speculative_tokens") == 3 and f.q == 4
    assert f.get("speculative_method") == "ngram"
    # the engine serves bfloat16 although config.json declares float16: a hint, not a conflict
    assert f.get("dtype") == "bfloat16" and f.sources["dtype"].startswith("engine log")
    assert f.get("max_model_len") == 1024 and f.get("vocab_size") == 500
    # the flag disagrees with the engine: both recorded, the engine's used, a warning
    assert [c["fact"] for c in f.conflicts] == ["block_size"]
    assert f.conflicts[0]["other"] == 16 and f.conflicts[0]["used"] == 128
    assert any("block_size" in w and "16" in w for w in f.warnings)
    d = f.to_dict()
    assert d["block_size"]["conflict"] is True
    assert {o["value"] for o in d["dtype"]["observed"]} == {"bfloat16", "float16"}
    assert "conflict" not in d["dtype"]
    # the engine says it has no sliding window: None, but not "unknown"
    assert d["sliding_window"] == {"value": None, "source": "/metrics vllm:cache_config_info: none"}
    assert d["attention_chunk_size"] == {"value": None, "source": "unknown"}


def test_reference_engine_ranks_launch_args_first():
    f = gather_facts(engine_args=["--block-size", "32"], launched=True,
                     client=_FakeClient(CACHE_INFO), engine_first=False)
    assert f.get("block_size") == 32  # the engine under test's launch argument
    assert f.get("kv_cache_size_tokens") == 262144  # the reference engine fills the rest


def test_sliding_window_hints_from_config(tmp_path):
    from pleharness.engine.fact_sources import model_config_observations
    (tmp_path / "config.json").write_text(json.dumps({
        "sliding_window": 512, "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}))
    obs, _ = model_config_observations(str(tmp_path))
    assert obs["sliding_window"] == 512
    assert obs["layer_types"] == {"sliding_attention": 5, "full_attention": 1}
    (tmp_path / "config.json").write_text(json.dumps({"sliding_window": 4096,
                                                      "use_sliding_window": False}))
    assert model_config_observations(str(tmp_path))[0]["sliding_window"] is None


def test_window_and_alignment_lengths():
    facts = {"num_speculative_tokens": 1, "block_size": 64, "cache_hit_alignment_tokens": 96,
             "sliding_window": 200}
    lengths, notes = boundary_lengths(facts, depth=2, controls=False, max_tokens=8)
    got = {b.length: b for b in lengths}
    # q = 2; n*B+q = 66, 130; n*A+q = 98, 194; W edges 199, 200, 201; crossing 200 - 4 = 196
    assert {66, 130, 98, 194, 199, 200, 201, 196} <= set(got)
    assert got[98].facts == ["cache_hit_alignment_tokens", "num_speculative_tokens"]
    assert got[196].facts == ["sliding_window"] and "crosses W" in got[196].why
    assert any("n*C + q lengths skipped" in n for n in notes)
    # lengths longer than max_len are dropped, said in the notes and handed back for table rows
    dropped = []
    kept, notes = boundary_lengths(facts, depth=2, controls=True, max_len=150, max_tokens=8,
                                   dropped=dropped)
    assert max(b.length for b in kept) <= 150
    assert [d.length for d in dropped] == [194, 199, 200, 201, 196]  # controls are not rows
    assert dropped[0].facts == ["cache_hit_alignment_tokens", "num_speculative_tokens"]
    # A equal to B adds nothing
    same, _ = boundary_lengths({"block_size": 64, "cache_hit_alignment_tokens": 64}, depth=1,
                               controls=False)
    assert [b.length for b in same] == [1, 65]


def test_capture_edges_derivation():
    from pleharness.scenarios.capture_edges import concurrency_levels
    levels, notes, skipped = concurrency_levels(
        {"cudagraph_capture_sizes": [1, 2, 4, 8], "cudagraph_mode": "FULL_AND_PIECEWISE",
         "max_num_seqs": 6})
    assert [lv.concurrency for lv in levels] == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    by = {lv.concurrency: lv for lv in levels}
    assert "falls out of the graphs" in by[9].why and "max_num_seqs + 1" in by[7].why
    assert skipped == []
    # speculative decoding: c*q crosses a capture size
    levels, _, _ = concurrency_levels({"cudagraph_capture_sizes": [8, 16], "max_num_seqs": 64,
                                       "num_speculative_tokens": 3})
    by = {lv.concurrency: lv for lv in levels}
    assert set(by) == {2, 3, 4, 5, 64, 65}
    assert "c*q = 20 crosses 16" in by[5].why and "falls out" in by[5].why
    # no graphs (CPU): the capture family is a skipped row with the reason
    levels, _, skipped = concurrency_levels({"cudagraph_capture_sizes": [], "max_num_seqs": 4})
    assert [lv.concurrency for lv in levels] == [4, 5]
    assert "empty" in skipped[0]["reason"]
    _, _, skipped = concurrency_levels({})
    assert {s["needs"][0] for s in skipped} == {"cudagraph_capture_sizes", "max_num_seqs"}
    # caps and thinning keep the edges of S_max and max_num_seqs
    levels, notes, _ = concurrency_levels({"cudagraph_capture_sizes": list(range(1, 65)),
                                           "max_num_seqs": 300}, max_concurrency=100,
                                          max_levels=6)
    cs = [lv.concurrency for lv in levels]
    assert len(cs) == 6 and 64 in cs and 65 in cs and 300 not in cs
    assert any("above max_concurrency" in n for n in notes)


def test_kv_pressure_plan():
    from pleharness.scenarios.kv_pressure import pressure_plan
    plan = pressure_plan({"kv_cache_size_tokens": 1280, "max_model_len": 1024, "max_num_seqs": 8},
                         prompt_len=32)
    assert plan["ok"] and plan["max_tokens"] == 1023 - 32
    assert plan["in_flight_tokens"] >= 2 * 1280 and plan["n"] == 3
    assert plan["prompt_len"] + plan["max_tokens"] <= 1023  # one request alone fits
    big = pressure_plan({"kv_cache_size_tokens": 262144, "max_model_len": 1024,
                         "max_num_seqs": 8})
    assert not big["ok"] and "smaller KV cache" in big["reason"]
    assert "unknown" in pressure_plan({})["reason"]


def test_metrics_info_and_preemptions():
    from pleharness.engine.metrics import PREEMPTIONS, info_labels
    assert info_labels(CACHE_INFO, "vllm:cache_config_info")["block_size"] == "128"
    assert "engine" not in info_labels(CACHE_INFO, "vllm:cache_config_info")
    assert parse_counters(CACHE_INFO)[PREEMPTIONS] == 3.0


def test_loopback_launch_turns_on_dev_mode_only_locally():
    from pleharness.engine.launch import LaunchSpec
    assert LaunchSpec(model="/m", python="/py").env["VLLM_SERVER_DEV_MODE"] == "1"
    assert "VLLM_SERVER_DEV_MODE" not in LaunchSpec(model="/m", python="/py", host="0.0.0.0").env
    assert LaunchSpec(model="/m", python="/py",
                      env={"VLLM_SERVER_DEV_MODE": "0"}).env["VLLM_SERVER_DEV_MODE"] == "0"


def test_cudagraph_mode_and_dtype_forms_compare_equal():
    from pleharness.engine.facts import EngineFacts
    f = EngineFacts()
    f.observe("cudagraph_mode", [2, 1], "/server_info?config_format=json", 1)  # JSON enum value
    f.observe("cudagraph_mode", "<CUDAGraphMode.FULL_AND_PIECEWISE", "engine log", 2)
    f.observe("dtype", "torch.bfloat16", "/server_info?config_format=json", 1)
    f.observe("dtype", "bf16", "launch argument --dtype", 11)
    f.observe("cudagraph_capture_sizes", [16, 1, 8, 2, 4], "engine log", 2)
    f.resolve_conflicts()
    assert f.get("cudagraph_mode") == "FULL_AND_PIECEWISE" and f.get("dtype") == "bfloat16"
    assert f.get("cudagraph_capture_sizes") == [1, 2, 4, 8, 16]
    assert f.conflicts == []
    f.observe("cudagraph_mode", 0, "launch argument", 11)
    f.resolve_conflicts()
    assert f.conflicts[0]["other"] == "NONE" and f.get("cudagraph_mode") == "FULL_AND_PIECEWISE"


def test_chunk_budget_from_compile_ranges_and_text_server_info():
    from pleharness.engine.fact_sources import log_observations, server_info_observations
    line = ("(EngineCore pid=1) INFO [core.py:116] Initializing a V1 LLM engine (v0.26.0) with "
            "config: model='/m', speculative_config=None, dtype=torch.bfloat16, "
            "compilation_config={'compile_sizes': [], 'compile_ranges_endpoints': [128, 256], "
            "'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>}\n")
    assert log_observations(line)["max_num_batched_tokens"] == 256
    # an explicit max_num_batched_tokens line wins over the compile ranges
    assert log_observations(line + "max_num_batched_tokens=512\n")["max_num_batched_tokens"] \
        == "512"
    # /server_info in text format (older servers) is read like the log line
    txt = server_info_observations({"vllm_config": line.split(" with config: ")[1]})
    assert txt["max_num_batched_tokens"] == 256 and txt["dtype"] == "torch.bfloat16"


def test_facts_command_usage_errors():
    from conftest import run_cli
    r = run_cli("facts", "--url", "http://127.0.0.1:1", timeout=120)
    assert r.returncode == 2 and "no engine answers" in r.stdout + r.stderr
    r = run_cli("facts", "--url", "http://127.0.0.1:1", "--model", "/x", timeout=120)
    assert r.returncode == 2 and "--url" in r.stderr and "--model" in r.stderr


def test_dtype_hint_from_config_is_what_auto_serves(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    f = gather_facts(model_path=str(tmp_path))
    assert f.get("dtype") == "bfloat16" and "downcast" in f.sources["dtype"]
    # the engine's own value (here: --dtype float32 on its command line) wins over the hint
    g = gather_facts(model_path=str(tmp_path), engine_args=["--dtype", "float32"], launched=True)
    assert g.get("dtype") == "float32" and g.conflicts == []


def test_typed_fact_reads():
    """EngineFacts' typed reads (issue 28): the resolved value in its type, None when unknown,
    an AttributeError for a name that is no fact (a typo never reads as "unknown")."""
    from pleharness.engine.facts import EngineFacts, _Fact, as_facts
    f = as_facts({"block_size": "32", "cudagraph_capture_sizes": [8, "1", 4],
                  "prefix_caching": 1, "num_speculative_tokens": 3, "sliding_window": [64, 512]})
    assert (f.block_size, f.cudagraph_capture_sizes, f.prefix_caching) == (32, [1, 4, 8], True)
    assert (f.q, f.max_model_len, f.vocab_or(), f.sliding_window) == (4, None, 256, [64, 512])
    assert as_facts(f) is f and as_facts(None).values == {}
    with pytest.raises(AttributeError):
        f.blocksize  # noqa: B018 - a typo
    with pytest.raises((TypeError, RuntimeError)):  # a descriptor for a name that is no fact
        type("Bad", (EngineFacts,), {"block_sise": _Fact(int)})
