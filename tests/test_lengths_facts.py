import json

import pytest

from pleharness.engine.errors import UsageError
from pleharness.engine.facts import gather_facts, parse_engine_args
from pleharness.engine.metrics import delta, parse_counters
from pleharness.profile import load_profile
from pleharness.scenarios.lengths import boundary_lengths
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
