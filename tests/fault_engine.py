"""An engine double the harness can *launch*: it stands in for ``python -m
vllm.entrypoints.openai.api_server ARGS`` and forwards to a real, already running CPU engine,
planting a fault only when a chosen flag is among its launch arguments (control runs and
``ple-harness explain`` switch flags off, so the fault must follow the flags).

Used through ``tests/fakepy/python`` as ``--engine-python``. Environment:

- ``PLE_FAULT_UPSTREAM``: base URL of the real engine (the tests' session engine), or ``spawn``:
  start a real engine of its own with the same launch arguments (a free port, the same process
  group, so the harness's stop ends it too) and forward to it, so that every launch costs what a
  real engine start costs (``benchmarks/time_to_diagnosis.py`` on a GPU);
- ``PLE_FAULT_WHEN``: when the fault is on: ``always``, ``never``, or comma-separated conditions
  on the launch arguments that must all hold: ``--flag`` (present), ``!--flag`` (absent) or
  ``--flag=VALUE`` (present with exactly that value, in the ``--flag VALUE`` or ``--flag=VALUE``
  form), e.g.
  ``--speculative-config,--max-num-batched-tokens=256`` (a fault that needs two features);
- ``PLE_FAULT_LEN``: optionally, only prompts of this many tokens are corrupted: an integer, or
  ``1+k`` with k the ``num_speculative_tokens`` of the launch's ``--speculative-config`` (a fault
  keyed to the speculative decoding step; off when the launch has no speculative config);
- ``PLE_REAL_PYTHON``: the real interpreter, for every other use of this "python" (``-c`` probes,
  the golden worker);
- ``PLE_NOISE``: set (non-empty), a clean mixture-of-experts engine's numerics are planted under
  the fault in every configuration (``tests/faults_noise.py``);
- ``PLE_FAULT_FAIL_START``: conditions as ``PLE_FAULT_WHEN`` under which the launch fails at once
  (a ``ValueError`` line, exit 1), as an engine refusing its configuration would (a control
  engine that cannot start).

The fault: output position 5 becomes (token + 1) mod the vocabulary size, with
``PLE_FAULT_MODE=crowded`` (default) while at least ``PLE_FAULT_MIN_IN_FLIGHT`` (default 2)
completion requests are in flight (a concurrency-dependent corruption, invisible to
single-request references), with ``PLE_FAULT_MODE=load`` on every run of a prompt after its
first two (deterministic: two configurations corrupt exactly the same requests), with
``PLE_FAULT_MODE=every`` on every run, alone or not (a defect that corrupts every run of a
prompt alike: only another configuration's answer shows it, issue 47), and with
``PLE_FAULT_MODE=third`` on one run in three, drawn per run with a generator seeded by
``PLE_FAULT_SEED`` (default 0) and the prompt (an intermittent defect, issue 47 item 5).
"""
import os
import random
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def arg_value(args, flag):
    """The value of ``flag`` in ``args`` (``--flag V`` or ``--flag=V``; "" for a bare flag), or
    None when absent (the last occurrence wins, as in vLLM's argparse)."""
    val = None
    for i, a in enumerate(args):
        name, eq, v = a.partition("=")
        if name == flag:
            val = v if eq else (args[i + 1] if i + 1 < len(args)
                                and not args[i + 1].startswith("--") else "")
    return val


def launch_matches(when, args) -> bool:
    """PLE_FAULT_WHEN (module docstring) against the launch arguments."""
    if when in ("always", "never"):
        return when == "always"
    for cond in filter(None, (c.strip() for c in when.split(","))):
        if cond.startswith("!"):  # the flag must be absent
            if arg_value(args, cond[1:]) is not None:
                return False
            continue
        flag, eq, want = cond.partition("=")
        got = arg_value(args, flag)
        if got is None or (eq and got != want):
            return False
    return True


def fault_len(spec, args):
    """PLE_FAULT_LEN (module docstring) -> the corrupted prompt length, or None (any length);
    -1 (no prompt matches) for ``1+k`` without a speculative config."""
    if not spec:
        return None
    if spec.replace(" ", "") == "1+k":
        import json
        cfg = arg_value(args, "--speculative-config")
        return 1 + int(json.loads(cfg)["num_speculative_tokens"]) if cfg else -1
    return int(spec)


def main(argv):
    real = os.environ["PLE_REAL_PYTHON"]
    if len(argv) < 3 or argv[1] != "-m" or not argv[2].startswith("vllm.entrypoints"):
        os.execv(real, [real] + argv[1:])
    from doubles import Fault, FaultProxy, set_top, top_first, top_of

    args = argv[3:]
    host, port = "127.0.0.1", None
    for i, a in enumerate(args):
        if a == "--port":
            port = int(args[i + 1])
        elif a == "--host":
            host = args[i + 1]
    fail_start = os.environ.get("PLE_FAULT_FAIL_START")
    if fail_start and launch_matches(fail_start, args):
        print("ValueError: planted start failure (PLE_FAULT_FAIL_START matched the launch "
              "arguments)", flush=True)
        return 1
    when = os.environ.get("PLE_FAULT_WHEN", "always")
    active = launch_matches(when, args)
    want_len = fault_len(os.environ.get("PLE_FAULT_LEN", ""), args)
    need = int(os.environ.get("PLE_FAULT_MIN_IN_FLIGHT", "2"))
    vocab = int(os.environ.get("PLE_FAULT_VOCAB", "793"))

    mode = os.environ.get("PLE_FAULT_MODE", "crowded")
    seed = os.environ.get("PLE_FAULT_SEED", "0")
    seen: dict = {}
    lock = threading.Lock()

    def hit(ctx) -> bool:
        """crowded: >= ``need`` requests in flight now (timing-dependent, like a batch-size bug);
        load: every run of a prompt after its first two (its cold and warm single-request runs),
        deterministic, so both configurations corrupt exactly the same requests. With
        ``PLE_FAULT_LEN``, only prompts of that length."""
        if want_len is not None and len(ctx.body.get("prompt") or []) != want_len:
            return False
        if mode == "every":
            return True
        if mode == "third":
            if "drawn" not in ctx.state:
                key = (tuple(ctx.body.get("prompt") or []), ctx.body.get("max_tokens"))
                with lock:
                    seen[key] = seen.get(key, 0) + 1
                    rng = random.Random(f"{seed}:{key}:{seen[key]}")
                    ctx.state["drawn"] = rng.random() < 1 / 3
            return ctx.state["drawn"]
        if mode == "load":
            if "occurrence" not in ctx.state:
                key = (tuple(ctx.body.get("prompt") or []), ctx.body.get("max_tokens"))
                with lock:
                    seen[key] = seen.get(key, 0) + 1
                    ctx.state["occurrence"] = seen[key]
            return ctx.state["occurrence"] >= 3
        return proxy.in_flight >= need

    class Busy(Fault):
        def chunk(self, ctx, chunk):
            for ch in chunk.get("choices") or []:
                ids = ch.get("token_ids") or []
                for i in range(len(ids)):
                    if ctx.tokens_so_far + i == 5 and hit(ctx):
                        new = (ids[i] + 1) % vocab
                        # the engine's own logprobs rank its (wrong) token first, as numerics
                        # that changed the argmax would (logprob_sanity checks that)
                        top = top_of(ch, i)
                        if top:
                            set_top(ch, i, top_first(top, new), new)
                        else:
                            ids[i] = new
            return chunk

    upstream = os.environ["PLE_FAULT_UPSTREAM"]
    child = None
    if upstream == "spawn":
        child, upstream = spawn_upstream(real, argv[2], args, host)
    fault = Busy() if active else Fault()
    if os.environ.get("PLE_NOISE"):  # a clean bf16 MoE engine's numerics under it (issue 47)
        from faults_noise import Chain, Numerics
        fault = Chain(Numerics(), fault)
    proxy = FaultProxy(upstream, fault, host, port)
    print(f"fault engine on {host}:{port}, fault {'ON' if active else 'off'} "
          f"(when {when}, prompt length {want_len}), args {args}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with proxy:
        done.wait()
    if child is not None:
        child.terminate()
    return 0


def spawn_upstream(real, module, args, host):
    """Start ``real -m module ARGS`` on a free port (``--port`` replaced), wait until its /health
    answers 200; return (process, base URL). Exits 1 when it dies first (its log is on stdout)."""
    import socket
    import subprocess
    import time
    import urllib.request
    with socket.socket() as s:
        s.bind((host, 0))
        up_port = s.getsockname()[1]
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == "--port":
            skip = True
            continue
        if not a.startswith("--port="):
            out.append(a)
    child = subprocess.Popen([real, "-m", module, *out, "--port", str(up_port)])
    url = f"http://{host}:{up_port}"
    while True:
        if child.poll() is not None:
            print(f"ValueError: the spawned upstream engine exited with {child.returncode}",
                  flush=True)
            sys.exit(1)
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return child, url
        except OSError:
            pass
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
