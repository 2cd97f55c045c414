"""The asyncio request path (pleharness/engine/client.py): ``run_batch`` keeps exactly C requests in
flight and keeps what finished when it is cancelled; ``abort_all`` cuts requests in flight from
another thread; the blocking facade ``complete`` and the coroutine ``acomplete`` give the same
answer. Against the self-answering double (tests/doubles.py FakeEngine), which here only injects
the never-answered request."""
import asyncio
import threading
import time

import pytest

from doubles import FakeEngine
from pleharness.engine.client import EngineClient


def test_run_batch_keeps_exactly_c_in_flight():
    cl = EngineClient("http://127.0.0.1:9")  # no request is sent: the jobs only sleep
    state = {"now": 0, "max": 0, "starts_at": []}

    async def job(i):
        state["starts_at"].append(state["now"])  # how many were in flight when i started
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        await asyncio.sleep(0.002 * (1 + i % 3))
        state["now"] -= 1
        return i

    try:
        out = cl.run_batch(list(range(40)), 4, job).wait()
    finally:
        cl.close()
    assert out == list(range(40))  # results in item order
    assert state["max"] == 4
    # the first 4 start together; every later one starts when one of 4 has just finished
    assert state["starts_at"][:4] == [0, 1, 2, 3]
    assert all(n == 3 for n in state["starts_at"][4:]), state["starts_at"]


def test_run_batch_runs_blocking_jobs_in_threads():
    cl = EngineClient("http://127.0.0.1:9")
    seen = set()

    def job(i):
        seen.add(threading.current_thread().name)
        time.sleep(0.01)
        return i * 2

    try:
        assert cl.run_batch(list(range(9)), 3, job).wait() == [i * 2 for i in range(9)]
    finally:
        cl.close()
    assert 1 < len(seen) <= 3 and all(n.startswith("ple-req") for n in seen)


def test_cancelled_batch_keeps_the_finished_and_abort_all_cuts_the_rest():
    with FakeEngine(lambda k, body: "never" if k > 2 else None) as eng:
        cl = EngineClient(eng.url, FakeEngine.MODEL)

        async def job(i):
            return await cl.acomplete([20 + i, 21], 4)
        batch = cl.run_batch(list(range(6)), 3, job)
        end = time.monotonic() + 20
        while eng.count < 5 and time.monotonic() < end:  # 2 answered, 3 hanging
            time.sleep(0.02)
        while len(batch.finished()) < 2 and time.monotonic() < end:  # their answers land (a
            time.sleep(0.02)                                           # loaded machine is slow)
        done = batch.finished()
        assert len(done) == 2  # which two items arrived first is a race
        assert all(c.error is None and len(c.token_ids) == 4 for _, c in done)
        # the harness's own order (RunContext on an interrupt): cancel the batch first, so that
        # no further item starts, then cut what is in flight (cutting first frees slots, and on
        # a loaded machine the sixth item could start before the cancel landed)
        batch.cancel()
        assert cl.abort_all("harness interrupted") in (0, 1, 2, 3)  # the cancel may be first
        with pytest.raises(BaseException):
            batch.wait()
        # the two answered items stay; the three cut by abort_all may land as "aborted" before
        # the cancel on a loaded machine (seen once in a full run beside a vLLM install)
        fin = batch.finished()
        assert len([c for _, c in fin if c.error is None]) == 2
        assert all(c.error == "aborted" for _, c in fin if c.error is not None)
        time.sleep(0.3)
        assert eng.count == 5  # the sixth item was never started
        # the client stays usable, and a blocking request cut by abort_all is recorded as such
        t = threading.Timer(0.5, lambda: cl.abort_all("stop"))
        t.start()
        c = cl.complete([1, 2, 3], 4)
        assert (c.error, c.error_detail) == ("aborted", "stop") and c.token_ids == []
        cl.close()


def test_blocking_facade_and_coroutine_agree():
    with FakeEngine() as eng:
        cl = EngineClient(eng.url, FakeEngine.MODEL)
        a = cl.complete([20, 21, 22], 6, logprobs=2)
        b = cl._run(cl.acomplete([20, 21, 22], 6, logprobs=2))
        cl.close()
    assert a.error is None and b.error is None
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs and len(a.itl_s) == 5
    assert a.ttft_s is not None and a.ttft_s <= a.latency_s


# -- several prompts in one request (EngineClient.acomplete_many, the kv_pressure path) ---------
class CannedSSE:
    """Answers every POST with the SSE events ``events`` (dicts, then ``data: [DONE]``) and
    keeps the request bodies: the wire format of vLLM's batched-prompt stream, for the faults
    a real engine never produces."""

    def __init__(self, events):
        import json
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        self.bodies = []
        me = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                me.bodies.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
                data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
                data += b"data: [DONE]\n\n"
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_port}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.srv.shutdown()


def _choice(i, ids, finish=None, usage=None):
    ev = {"choices": [{"index": i, "text": "t" * len(ids), "token_ids": ids,
                       "finish_reason": finish}]}
    if usage:
        ev["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1]}
    return ev


def test_acomplete_many_splits_choices_by_index_with_their_own_usage():
    events = [_choice(1, [7], usage=(2, 1)), _choice(0, [5], usage=(3, 1)),
              _choice(0, [6], "length", (3, 2)), _choice(1, [8], "length", (2, 2)),
              {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}}]
    with CannedSSE(events) as srv:
        cl = EngineClient(srv.url, "m")
        try:
            a, b = cl._run(cl.acomplete_many([[1, 2, 3], [4, 5]], 2))
        finally:
            cl.close()
    body = srv.bodies[0]
    assert body["prompt"] == [[1, 2, 3], [4, 5]] and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert (a.token_ids, a.prompt_tokens, a.completion_tokens, a.finish_reason, a.error) == \
        ([5, 6], 3, 2, "length", None)
    assert (b.token_ids, b.prompt_tokens, b.completion_tokens, b.finish_reason, b.error) == \
        ([7, 8], 2, 2, "length", None)  # the last, summed usage event is nobody's
    assert a.text == "tt" and a.ttft_s is not None and a.latency_s >= a.ttft_s


def test_bodies_leave_optional_fields_out_at_their_default():
    """Issue 35 item 7: a request at vLLM's default ignore_eos (false) is sent without the field,
    as clients write it; the harness's fixed-length requests send ignore_eos true; chat too;
    temperature is always sent."""
    events = [_choice(0, [5], "length", (3, 1))]
    with CannedSSE(events) as srv:
        cl = EngineClient(srv.url, "m")
        try:
            cl._run(cl.acomplete([1, 2, 3], 1, ignore_eos=False))
            cl._run(cl.acomplete([1, 2, 3], 1))
            cl._run(cl.achat([{"role": "user", "content": "hi"}], 1, ignore_eos=False))
        finally:
            cl.close()
    plain, fixed, chat = srv.bodies[:3]
    assert "ignore_eos" not in plain and plain["temperature"] == 0.0
    assert not {"seed", "stop", "logprobs"} & set(plain)
    assert fixed["ignore_eos"] is True
    assert "ignore_eos" not in chat and chat["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("events, error", [
    ([_choice(0, [5], "length"), _choice(2, [6], "length")], "index 2 outside the 2 prompts"),
    ([_choice(0, [5], "length"), _choice(1, [6])], "without a finish_reason"),
])
def test_acomplete_many_fails_what_it_cannot_place(events, error):
    with CannedSSE(events) as srv:
        cl = EngineClient(srv.url, "m")
        try:
            outs = cl._run(cl.acomplete_many([[1], [2]], 1))
        finally:
            cl.close()
    bad = [o for o in outs if o.error is not None]
    assert bad and all(o.error == "protocol" and error in o.error_detail for o in bad), \
        [(o.error, o.error_detail) for o in outs]
