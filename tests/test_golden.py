"""Trust: the pinned embedded model, the golden classifier, the dtype-derived near-tie threshold."""
import json
import shutil
import sys

import pytest

from conftest import run_cli
from pleharness.divergence import analyse, near_tie_threshold, normalize_dtype
from pleharness.errors import HarnessError
from pleharness.golden import GoldenModel, golden_problem
from pleharness import model as embedded


# -- the embedded model: the same bytes everywhere --------------------------------------------
def test_every_shipped_file_is_pinned_and_verified():
    files = {p.name for p in embedded.SHIPPED_DIR.iterdir() if p.is_file()}
    assert files == set(embedded.PINNED_SHA256), "every shipped model file must be pinned"
    assert embedded.WEIGHTS_SHA256 == embedded.PINNED_SHA256["model.safetensors"]
    assert embedded.ensure_embedded_model() == embedded.SHIPPED_DIR
    assert embedded.model_digest(embedded.SHIPPED_DIR) == {
        "kind": "embedded", "weights_sha256": embedded.WEIGHTS_SHA256, "verified": True}


def test_a_changed_model_file_is_a_clear_error(tmp_path):
    copy = tmp_path / "m"
    shutil.copytree(embedded.SHIPPED_DIR, copy)
    embedded.verify_embedded_model(copy)
    with open(copy / "model.safetensors", "r+b") as f:
        f.seek(4096)
        b = f.read(1)
        f.seek(4096)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(HarnessError, match=r"model.safetensors has SHA256 .* pinned value .* "
                                           r"Reinstall"):
        embedded.verify_embedded_model(copy)
    shutil.copy(embedded.SHIPPED_DIR / "model.safetensors", copy / "model.safetensors")
    (copy / "tokenizer.json").unlink()
    with pytest.raises(HarnessError, match="tokenizer.json is missing"):
        embedded.verify_embedded_model(copy)


def test_fingerprint_of_another_model(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model-00001.safetensors").write_bytes(b"x" * 10)
    d = embedded.model_digest(tmp_path)
    assert d["kind"] == "fingerprint" and d["weight_files"] == {"model-00001.safetensors": 10}
    assert embedded.model_digest("org/some-hub-id")["kind"] == "unknown"


def test_build_model_command_verifies():
    r = run_cli("build-model", timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(embedded.SHIPPED_DIR)
    assert embedded.WEIGHTS_SHA256 in r.stderr


# -- near-tie threshold from the serving dtype ------------------------------------------------
def test_near_tie_threshold_follows_the_dtype():
    assert near_tie_threshold("bfloat16") == (0.5, "serving dtype bfloat16")
    assert near_tie_threshold("torch.float16")[0] == 0.0625
    assert near_tie_threshold("float32")[0] == 0.01
    nats, why = near_tie_threshold(None)
    assert nats == 0.5 and "unknown" in why
    assert near_tie_threshold("float32", override=0.2) == (0.2, "--near-tie-nats")
    assert normalize_dtype("auto") is None and normalize_dtype("bf16") == "bfloat16"
    # the H200 observation: a 0.125-nat margin in bf16 is one bf16 step, a near tie
    ref, obs = [1, 2, 3, 4], [1, 2, 9, 4]
    d = analyse(ref, obs, 2, [1.0, 1.0, 0.125, 1.0], near_tie_threshold("bfloat16")[0])
    assert d.cls == "near_tie"
    d = analyse(ref, obs, 2, [1.0, 1.0, 0.125, 1.0], near_tie_threshold("float32")[0])
    assert d.cls == "hard"


# -- golden classification rule (constructed evidence) ------------------------------------------
REF, OBS = [5, 6, 7, 8, 9], [5, 6, 70, 8, 9]


def golden(lp_ref, lp_obs, top=None):
    top = top if top is not None else sorted([(7, lp_ref), (70, lp_obs), (1, -9.0)],
                                             key=lambda t: -t[1])
    return {"logprobs": {7: lp_ref, 70: lp_obs}, "top": top}


def test_golden_decides_whatever_the_engine_margin_says():
    tiny = [0.001] * 5  # the engine claims a near tie everywhere
    d = analyse(REF, OBS, 2, tiny, 0.5, golden=golden(-0.1, -6.0, [(7, -0.1), (1, -3.0)]))
    assert d.cls == "hard" and d.fails and d.classified_by == "golden"
    assert d.golden_gap_nats == pytest.approx(5.9) and not d.observed_in_golden_top
    big = [9.0] * 5  # the engine margin says hard, the golden model finds a real tie
    d = analyse(REF, OBS, 2, big, 0.5, golden=golden(-0.70, -0.72))
    assert d.cls == "near_tie" and not d.fails and d.golden_gap_nats == pytest.approx(0.02)
    # a gap above the threshold is hard even with both tokens in the top-k
    d = analyse(REF, OBS, 2, tiny, 0.5, golden=golden(-0.2, -1.5))
    assert d.cls == "hard"
    # each side's token must be in the other side's engine top-k where returned
    d = analyse(REF, OBS, 2, tiny, 0.5, golden=golden(-0.70, -0.72), reference_top={7: -0.1, 3: -2})
    assert d.cls == "hard" and d.observed_in_reference_top is False
    d = analyse(REF, OBS, 2, tiny, 0.5, golden=golden(-0.70, -0.72),
                reference_top={7: -0.1, 70: -0.2}, observed_top={70: -0.1, 7: -0.2})
    assert d.cls == "near_tie"


def test_golden_problem_guards():
    assert "no local model folder" in golden_problem(None)
    assert "no config.json" in golden_problem("/nonexistent")
    assert golden_problem(embedded.SHIPPED_DIR) is None


def test_golden_model_too_big_is_refused(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    import pleharness.golden as g
    monkeypatch.setattr(g, "available_memory_bytes", lambda: 3000)
    msg = golden_problem(tmp_path)
    assert msg and "too big" in msg and "--reference solo" in msg


# -- the golden worker on the embedded model (real transformers, float32) -----------------------
@pytest.fixture(scope="module")
def gold(tmp_path_factory):
    g = GoldenModel(embedded.SHIPPED_DIR, sys.executable,
                    log_path=tmp_path_factory.mktemp("golden") / "golden.log")
    yield g
    g.close()


def test_golden_generate_is_greedy_and_consistent_with_teacher_forcing(gold):
    prompt = list(range(20, 60))
    out = gold.generate(prompt, 12)
    assert len(out.ids) == 12 and len(out.top) == 12
    for ids_top, tok in zip(out.top, out.ids):
        lps = [lp for _, lp in ids_top]
        assert lps == sorted(lps, reverse=True) and ids_top[0][0] == tok  # greedy = top-1
        assert all(lp <= 0 for lp in lps)
    # teacher forcing the generated prefix reproduces the generation's distribution at step 5
    lps, top = gold.score(prompt, out.ids[:5], [out.ids[5], out.top[5][1][0]])
    assert top[0][0] == out.ids[5]
    assert lps[out.ids[5]] == pytest.approx(out.top[5][0][1], abs=1e-4)
    assert lps[out.top[5][1][0]] == pytest.approx(out.top[5][1][1], abs=1e-4)
    assert gold.generate(prompt, 12) is out  # cached


def test_golden_worker_that_cannot_start_is_a_clear_error(tmp_path):
    g = GoldenModel(embedded.SHIPPED_DIR, "/bin/false", log_path=tmp_path / "g.log")
    with pytest.raises(HarnessError, match="exited with code 1 before it was ready"):
        g.generate([1, 2, 3], 2)


def test_reference_golden_needs_a_local_model_and_the_golden_model(tmp_path):
    from doubles import FakeEngine
    small = ["--scenario", "transitions", "--ladder", "1", "--repeats", "1", "--max-tokens", "4",
             "--vocab-size", "600", "--results-dir", str(tmp_path)]
    with FakeEngine() as eng:
        r = run_cli("stress", "--url", eng.url, "--reference", "golden", *small, timeout=120)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "--reference golden: no local model folder" in r.stderr and "--golden-model" in r.stderr
        r = run_cli("stress", "--url", eng.url, "--reference", "golden", "--no-golden", *small,
                    timeout=120)
        assert r.returncode == 2 and "drop --no-golden" in r.stderr
        r = run_cli("stress", "--url", eng.url, "--dtype", "fp8", *small, timeout=120)
        assert r.returncode == 2 and "--dtype 'fp8'" in r.stderr
        # a run without a local model records why divergences are judged by the engine margin
        r = run_cli("stress", "--url", eng.url, "--dtype", "float16", "--run-id", "nogold", *small,
                    timeout=120)
        assert r.returncode == 0, r.stdout
        m = json.loads((tmp_path / "nogold" / "manifest.json").read_text())
        assert m["run_options"]["golden_classifier"].startswith("unavailable:")
        assert m["run_options"]["near_tie_nats"] == 0.0625
        assert m["facts"]["dtype"] == {"value": "float16", "source": "command-line flag"}
