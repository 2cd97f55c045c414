"""What a clean CPU engine's run of a shipped scenario records (cpu-ngram: block size 32, chunk
budget 256, ngram speculative decoding k = 3, `--api both`): one function per scenario, given a
manifest that holds the scenario's requests, alone or among the default suite's.

The default-suite test (test_e2e_cpu.py::test_stress_default_suite_launch) asserts every one of
them on its one run; each scenario's own clean-engine test (nightly, issue 49) asserts its
function on a run of that scenario alone. Requests and phases are picked by their scenario, so
the same assertions hold in both."""

B, C = 32, 256


def checks_of(q: dict, name: str) -> list[dict]:
    return [c for c in q["checks"] if c["name"] == name]


def of_scenario(m: dict, scenario: str) -> list[dict]:
    return [q for q in m["requests"] if q["scenario"] == scenario]


def phase(m: dict, name: str) -> dict:
    return next(p for p in m["phases"] if p["name"] == name)


def pcheck(m: dict, ph: str, name: str) -> dict:
    return next(c for c in phase(m, ph)["checks"] if c["name"] == name)


def failed(q: dict) -> set[str]:
    return {c["name"] for c in q["checks"] if c["status"] == "fail"}


def is_problem(q: dict) -> bool:
    return bool(failed(q)) or (q["match"] is False and q["error"] is None
                               and (q["divergence"] or {}).get("fails", True)) \
        or (q["error"] is not None and not q["error_expected"])


def sampled(m: dict) -> None:
    (plan,) = m["tables"]["sampled_seeds"]
    # on this CPU engine with speculative decoding top_p / top_k are left out (they kill its
    # engine core); seeded parity (c) runs exactly when the engine probe allows seeded samples
    # and the seed probe measured that seeds reproduce (here, tests run without the engine
    # probe and speculative decoding is on: left out, (b) judges alone)
    assert plan["sampling"] == "temperature 1" and "engine core dies" in plan["sampling_note"]
    assert plan["seeded_parity"].startswith("left out") is (plan["reproduce"] is not True)
    rows = m["tables"]["sampled_distribution"]
    assert {x["test"] for x in rows} == {"first_tokens", "expected_text", "degeneration"}
    assert all(x["verdict"] == "pass" and x["solo"] > 0 and x["load"] > 0 for x in rows)
    dist = [x for x in rows if x["test"] == "first_tokens"]
    assert [x["load"] for x in dist] == [32, 32]
    samples = [q for q in of_scenario(m, "sampled") if q["temperature"] > 0]
    assert samples and all(q["error"] is None for q in samples)
    load = [p for p in m["phases"] if p["role"] == "load" and p["scenario"] == "sampled"]
    drafts = sum(((p.get("engaged") or {}).get("spec_decode") or {}).get("drafts") or 0
                 for p in load)
    assert drafts > 0, "no speculative step verified a sampled draft"


def stop_strings(m: dict) -> None:
    stops = m["tables"]["stop_strings"]
    assert len(stops) >= 2
    want = {(s["prompt_key"], s["stop"]): s["expected_ids"] for s in stops}
    judged = [q for q in of_scenario(m, "stop_strings") if (q.get("params") or {}).get("stop")]
    # each stop request: its two references, streamed and non-streamed under load, and (--api
    # both, the default: the counting prompt is its chat template) one chat twin under load
    assert len([q for q in judged if q.get("api") != "chat"]) == 4 * len(stops)
    assert len([q for q in judged if q.get("api") == "chat"]) == len(stops)
    for q in judged:
        (stop,) = q["params"]["stop"]
        assert q["output_len"] == want[(q["prompt_key"], stop)], q
        assert q["finish_reason"] == "stop"
        assert [c["status"] for c in checks_of(q, "stop_string")] == ["pass"]
    assert {q["stream"] for q in judged if q["phase"] == "stop-c8"} == {True, False}


def mixed_params(m: dict) -> None:
    rows = {row["variant"]: row for row in m["tables"]["mixed_params"]}
    # on a speculative engine: logit_bias is refused by vLLM, the sampled neighbour left out
    assert rows["logit-bias"]["left_out"] and rows["sampled"]["left_out"]
    assert all(rows[v]["compared"] for v in ("repetition", "frequency", "presence", "eos",
                                             "stop-token", "min-tokens", "min-tokens-stop"))
    # issue 52's shapes this engine cannot serve are left out with the reason, not sent
    for v in ("top-k", "top-p", "min-p"):
        assert "speculative decoding" in rows[v]["left_out"], rows[v]
    for v in ("min-tokens-eos", "special-text", "stop-eos-id"):
        assert "logit_bias" in rows[v]["left_out"], rows[v]
    assert "no LoRA adapter" in rows["adapter"]["left_out"]
    mixed = [q for q in m["requests"] if q["phase"] == "mixed-c8"]
    assert {tuple(sorted((q.get("params") or {}))) for q in mixed} >= {
        (), ("repetition_penalty",), ("frequency_penalty",), ("presence_penalty",),
        ("ignore_eos",), ("stop_token_ids",), ("min_tokens", "stop_token_ids"),
        ("min_tokens", "stop")}
    assert all(q["match"] for q in mixed)
    # token-level stops (issue 35 item 5): the stop-token variant stopped on its stop ID, which
    # its prompt's default output emits at position 8 (or earlier), and both obeyed the rules
    stops = [q for q in m["requests"] if (q.get("params") or {}).get("stop_token_ids")]
    assert stops and all([c["status"] for c in checks_of(q, "stop_token")] == ["pass"]
                         for q in stops)
    (st,) = [q for q in mixed if list(q["params"] or {}) == ["stop_token_ids"]]
    assert st["finish_reason"] == "stop" and st["output_len"] <= 9
    assert rows["stop-token"]["differs_from_default"] is True


def prompt_logprobs(m: dict) -> None:
    rows = m["tables"]["prompt_logprobs"]
    assert {(row["way"], row["chunks"]) for row in rows} == {
        ("prompt_logprobs", 1), ("echo", 1), ("prompt_logprobs", 2), ("echo", 2)}
    assert all(row["rules"] == "pass" and row["max_diff_nats"] is not None
               and row["max_diff_nats"] <= 0.01 for row in rows)
    qs = [q for q in of_scenario(m, "prompt_logprobs")
          if "prompt_logprobs" in (q.get("params") or {}) or (q.get("params") or {}).get("echo")]
    assert len(qs) == 12  # 2 prompts x 2 ways x (cold reference, warm reference, load)
    for q in qs:
        (rule,) = checks_of(q, "prompt_logprobs")
        assert rule["status"] == "pass", rule
        assert f"{q['prompt_len'] - 1} entries" in rule["detail"]
    load = [q for q in qs if q["phase"] == "prompt-logprobs-c4"]
    assert len(load) == 4
    assert all(checks_of(q, "prompt_logprobs_parity")[0]["status"] == "pass" for q in load)
    # prompt_logprobs go non-streamed (vLLM refuses them streamed), echo streams
    assert {(bool(q["params"].get("echo")), q["stream"]) for q in qs} == {(False, False),
                                                                         (True, True)}


CONSTRAINED_LOAD = ("constrained-c4", "constrained-c4-swapped")


def constrained(m: dict) -> None:
    rows = m["tables"]["constrained"]
    assert len(rows) == 12 and {r_["kind"] for r_ in rows} == {"json", "regex", "choice"}
    assert all(x["sent"] and x["rule"] == "pass" and x["match"] is True
               and x["finish_reason"] == "stop" for x in rows)
    assert {(x["phase"], x["stream"]) for x in rows} == {(CONSTRAINED_LOAD[0], True),
                                                         (CONSTRAINED_LOAD[1], False)}
    qs = [q for q in m["requests"] if "structured_outputs" in (q.get("params") or {})]
    assert len(qs) == 6 * 4  # the solo references (cold, then warm) and the two load phases
    for q in qs:  # every constrained output judged complete, sent with ignore_eos off
        (rule,) = checks_of(q, "constrained")
        assert rule["status"] == "pass" and "conforms" in rule["detail"], rule
        assert q["params"]["ignore_eos"] is False and q["output_len"] < 24
    nbs = [q for q in m["requests"] if q["phase"] in CONSTRAINED_LOAD and q not in qs]
    assert len(nbs) == 8 and all(q["match"] is True for q in nbs)
    assert not any(c["status"] == "fail" for q in of_scenario(m, "constrained")
                   for c in q["checks"])


def disconnects(m: dict, summary_md: str) -> None:
    assert not any(is_problem(q) for q in of_scenario(m, "disconnects"))
    # the two planned disconnects are recorded as abandoned, not as failures
    rows = m["tables"]["disconnects"]
    pre = next(x for x in rows if x["role"] == "abandoned before the first token")
    assert pre["result"] == "abandoned after 0 tokens" and pre["prompt_len"] > C
    mid = next(x for x in rows if x["role"] == "abandoned mid-decode")
    mid_rec = next(q for q in m["requests"] if q["id"] == mid["request_id"])
    # on a machine too slow to read the stream before it ends, the disconnect is a warning
    (dc,) = checks_of(mid_rec, "client_disconnect")
    assert (mid_rec["error"], dc["status"]) in (("abandoned", "pass"), (None, "warn"))
    assert all(x["result"] == "= reference" for x in rows if x["role"] == "neighbour")
    after = [x for x in rows if x["phase"] == "after-disconnect"]
    assert len(after) == 4 and all(x["result"] == "= reference" for x in after)
    resent = [q for q in m["requests"] if q["phase"] == "after-disconnect"
              and checks_of(q, "abandoned_prefix")]
    assert resent and all(c["status"] == "pass" for q in resent
                          for c in checks_of(q, "abandoned_prefix"))
    assert pcheck(m, "disconnect", "fresh_cache")["status"] == "pass"
    settle = pcheck(m, "disconnect", "engine_after_disconnect")
    assert settle["status"] == "pass" and "abort" in settle["detail"]
    assert pcheck(m, "after-disconnect", "prefix_cache_reuse")["status"] == "pass"
    assert phase(m, "after-disconnect")["engaged"]["prefix_cache"]["hit_tokens"] > 0
    assert "### Client disconnects" in summary_md


def prefix_isolation(m: dict) -> None:
    assert not any(is_problem(q) for q in of_scenario(m, "prefix_isolation"))
    # every near duplicate equals its own fresh-cache reference; the cache was hit on exactly
    # the whole blocks each shares with the original (block 1: block 0)
    iso = m["tables"]["prefix_isolation"]
    assert [(x["block"], x["offset"]) for x in iso] == [(0, B // 2), (0, B - 1), (1, B // 2),
                                                        (1, B - 1)]
    assert all(x["result"] == "= reference" and x["reference_cache"] == "fresh (reset)"
               for x in iso)
    assert any(x["reference_differs_from_original"] for x in iso)
    tested = pcheck(m, "isolation-near-duplicates", "prefix_isolation_tested")
    assert tested["status"] == "pass", tested
    hits = phase(m, "isolation-near-duplicates")["engaged"]["prefix_cache"]["hit_tokens"]
    assert hits == sum(x["shared_whole_blocks"] for x in iso) * B
    assert phase(m, "isolation-original")["engaged"]["prefix_cache"]["hit_tokens"] == 0  # fresh
    for ref in [p for p in m["phases"] if p["name"].startswith("isolation-ref-")]:
        assert ref["engaged"]["prefix_cache"]["hit_tokens"] == 0  # each on a fresh cache


def chat_twins(m: dict, console: str) -> None:
    """`--api both`: the chat twins of stop_strings and insert (the padded boundary-length
    inserts have no message form) each equal their completions reference, streamed, under load
    only; ``console``: the run's stdout and stderr."""
    ro = m["run_options"]
    assert (ro["api"], ro["api_used"], ro["chat_template"]) == ("both", "both", True)
    chat = [q for q in m["requests"] if q.get("api") == "chat"]
    paths = m["summary"]["api_paths"]
    assert sum(p["chat"] for p in paths.values()) == len(chat)
    assert paths["insert"]["chat_twins"] == 1 and paths["stop_strings"]["chat_twins"] >= 3
    assert paths["insert"]["no_chat_form"] >= 1
    twins = [q for q in chat if q["scenario"] != "chat_api"]  # chat_api's own are no twins
    assert len(twins) == sum(p["chat_twins"] for p in paths.values())
    assert all(q["match"] is True and q["stream"] for q in twins)
    assert all(q["output_hash"] == q["reference_hash"] for q in twins)
    ref_phases = {p["name"] for p in m["phases"] if p["role"] != "load"}
    assert not any(q["phase"] in ref_phases for q in twins)  # references: completions only
    # the decode's twin counts too, and each stop twin stops where its completions twin does
    (dec,) = [q for q in twins if q["phase"] == "insert"]
    assert [c["status"] for c in checks_of(dec, "counting")] == ["pass"]
    stops = [q for q in twins if (q.get("params") or {}).get("stop")]
    assert stops and all(q["finish_reason"] == "stop" for q in stops)
    assert all([c["status"] for c in checks_of(q, "stop_string")] == ["pass"] for q in stops)
    assert f"api both: {len(chat)} chat request(s) ({len(twins)} twins)" in console
