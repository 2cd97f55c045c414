"""Issue 35 item 1: the /v1/chat/completions path. The client reads chat chunks into the same
Completion as completions chunks; scenario kind ``chat_api`` passes on the real CPU engine (the
embedded model has a chat template) and fails, naming the request, when a double corrupts the
chat path only, or reports other prompt IDs than /tokenize of the same messages."""
import pytest

from conftest import NO_GOLDEN, load_json, run_cli
from doubles import Fault, FaultProxy
from pleharness.faults.families import ChatFlipUnderLoad
from pleharness.engine.completion import Completion, _from_chat
from pleharness.scenarios.chat_api import ChatApiParams, conversations

FACTS = ["--block-size", "32", "--chunk-size", "256", "--num-speculative-tokens", "3"]


def test_chat_chunks_read_as_completion_chunks():
    out = Completion(logprobs=[], token_logprobs=[])
    role = _from_chat({"prompt_token_ids": [1, 2, 3], "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": ""}}]}, out)
    assert out.prompt_token_ids == [1, 2, 3] and role["choices"] == []
    tok = _from_chat({"choices": [{"index": 0, "delta": {"content": " hi"}, "token_ids": [7, 8],
                                   "logprobs": {"content": [
                                       {"token": "token_id:7", "logprob": -0.5, "top_logprobs": [
                                           {"token": "token_id:7", "logprob": -0.5},
                                           {"token": "token_id:9", "logprob": -1.5}]}]}}]}, out)
    (ch,) = tok["choices"]
    assert ch["text"] == " hi" and ch["token_ids"] == [7, 8] and ch["finish_reason"] is None
    assert ch["logprobs"]["top_logprobs"] == [{"token_id:7": -0.5, "token_id:9": -1.5}]
    assert ch["logprobs"]["token_logprobs"] == [-0.5]
    fin = _from_chat({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                      "usage": {"prompt_tokens": 3, "completion_tokens": 2}}, out)
    assert fin["choices"][0]["finish_reason"] == "length" and fin["usage"]["completion_tokens"] == 2
    # text without token IDs (a server without return_token_ids on chat) stays a failure
    (bare,) = _from_chat({"choices": [{"index": 0, "delta": {"content": "x"}}]}, out)["choices"]
    assert "token_ids" not in bare


def test_conversations_are_seeded_and_shaped():
    p = ChatApiParams(conversations=8, seed=3)
    a, b = conversations(p), conversations(p)
    assert a == b and len(a) == 8
    assert [m[0][0] for m in a][:3] == ["user", "user", "system"]
    assert [r for r, _ in a[3]] == ["user", "assistant", "user"]
    assert all(m[-1][0] == "user" for m in a)
    assert conversations(ChatApiParams(conversations=8, seed=4)) != a


def stress(url, tmp_path, run_id, *more):
    r = run_cli("stress", "--url", url, "--results-dir", str(tmp_path), "--run-id", run_id,
                "--no-engine-probe", *FACTS, "--scenario", "chat_api", *more)
    return r, r.stdout + r.stderr, load_json(tmp_path / run_id / "manifest.json")


class ChatPromptShift(Fault):
    """The first chat answer reports prompt IDs with one token dropped (a template that differs
    from /tokenize's)."""

    chat = True

    def __init__(self):
        self.hits = []

    def chunk(self, ctx, chunk):
        if "messages" in ctx.body and chunk.get("prompt_token_ids") and not self.hits:
            chunk["prompt_token_ids"] = chunk["prompt_token_ids"][1:]
            self.hits.append(ctx.number)
        return chunk


@pytest.mark.engine
def test_chat_path_defects_fail_the_run_naming_the_requests(cpu_engine, tmp_path):
    """Two planted chat-path defects in one run (the clean chat path passes in the default
    suite: test_e2e_cpu): the first chat answer reports prompt IDs with a token dropped (the
    chat_template check fails on the solo phase), and chat answers under load get position 5
    changed (parity fails on those chat requests only; completions are untouched)."""
    class Both(ChatFlipUnderLoad):
        def __init__(self):
            super().__init__()
            self.shift = ChatPromptShift()

        def chunk(self, ctx, chunk):
            return super().chunk(ctx, self.shift.chunk(ctx, chunk))
    fault = Both()
    with FaultProxy(cpu_engine.url, fault) as proxy:
        r, out, m = stress(proxy.url, tmp_path, "faults", NO_GOLDEN)
    assert fault.hits and fault.shift.hits
    assert r.returncode == 1 and m["verdict"] == "fail", out[-3000:]
    bad = [q for q in m["requests"] if q["match"] is False]
    assert bad and all(q["api"] == "chat" and q["phase"] == "chat-api-c4" for q in bad)
    assert all(q["first_divergence"] == 5 for q in bad)
    solo = next(p for p in m["phases"] if p["name"] == "chat-api-solo")
    (chk,) = [c for c in solo["checks"] if c["name"] == "chat_template"]
    assert chk["status"] == "fail" and "chat-api-0: differs at 0" in chk["detail"]
    assert [r["template"] for r in m["tables"]["chat_api"]][0].startswith("differs at 0")
