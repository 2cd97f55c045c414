"""The reproducer writer of the ``fuzz`` kind: a failing :class:`~.strategy.Schedule` as a
``replay`` scenario file (:func:`write_repro`; ``ple-harness stress --scenario repro.toml``
replays it), and the ``fuzz_failing`` table of its requests (:func:`failing_rows`). Writes files
and rows only: the runner (:mod:`.runner`) decides which schedule is written."""
from __future__ import annotations

import json
from pathlib import Path

from ...manifest import write_atomic
from ..fuzz_features import failing_fields, toml_lines
from .rows import FailingRow
from .strategy import FuzzPhase, PhaseSpecs, Schedule

# a reproducer's carrier decodes at least this many tokens past its last insert's position, so
# the insert reaches the engine while the carrier still runs on a slower or faster machine too
# (measured, CPU engine: an insert meant for carrier token 27 of 45 went out at client-seen
# position 39, one merged chunk later, and reached the engine after the carrier had ended; with
# 64 tokens of runway, 1 of 2 replays on a loaded 2-core host still landed its insert after the
# carrier's end: the tiny model decodes 64 tokens in ~0.1 s). A replay that still misses says so
# (phase check inserts_landed) and is not counted as a failure to reproduce.
REPRO_RUNWAY_TOKENS = 256


def failing_rows(sched: Schedule, specs: list[PhaseSpecs]) -> list[FailingRow]:
    """The ``fuzz_failing`` table of ``sched`` (its requests ``specs``, phase by phase): one
    row per request, carrier and insert, with its drawn features and the parameters sent
    (:func:`~pleharness.scenarios.fuzz_features.failing_fields`)."""
    return [
        FailingRow(phase=i, concurrency=ph.concurrency, role=role, source=r.source,
                   prompt_len=r.length, why=r.why, shape=r.shape, seed=r.seed,
                   max_tokens=r.max_tokens, stream=r.stream, sample_seed=r.sample_seed,
                   insert_after_tokens=at, **failing_fields(s, r.features))
        for i, (ph, ps) in enumerate(zip(sched.phases, specs), 1)
        for role, r, at, s in [("request", r, None, s) for r, s in zip(ph.requests, ps.requests)]
        + ([("carrier", ph.carrier, None, ps.carrier)] if ph.carrier else [])
        + [("insert", x.request, x.at, s) for x, (s, _) in zip(ph.inserts, ps.inserts)]]


def write_repro(phases: list[PhaseSpecs], sched: Schedule, path: Path, run_id: str, *,
                sent: list | None = None, failed: list | None = None,
                what: str = "minimal failing schedule", max_model_len: int | None = None,
                runway: int = REPRO_RUNWAY_TOKENS) -> None:
    """The schedule as a ``replay`` scenario file at ``path`` (token-ID prompts, max_tokens, one
    ``[[params.phases]]`` per phase with its concurrency; a carrier is a request of its phase,
    each insert names it with ``insert_into`` and ``insert_after_tokens``; seeded samples carry
    ``temperature`` and ``seed``).

    ``sent``: the inserts' send positions in the failing run (rows ``[phase, insert, client-seen
    carrier position, carrier still running]``,
    :meth:`~.example.FuzzExamples.run_example`): an insert is written with
    ``insert_after_tokens`` = the position it was actually sent at when that is later than the
    drawn one (the client sees the carrier's tokens in chunks, and a slower machine merges
    more of them into one chunk: the drawn position alone does not say how far the carrier was;
    the trigger waits on the carrier's streamed token count, never on time, so the replay sends
    it no earlier than that). A carrier with inserts decodes at least ``runway`` tokens past
    its last insert's position (its max_tokens raised where needed, within ``max_model_len``
    when known, and said in its note): greedy, its output is the same prefix, and the insert
    still lands while it runs where the client sees the stream later than the engine produces
    it. ``failed``: the failed comparisons (:meth:`~.example.FuzzExamples._failed`), written
    as ``[[params.failed]]`` with the phase names of this file."""
    pos = {(int(p), int(j)): (int(n), bool(run)) for p, j, n, run in (sent or [])}
    lines = [f"# ple-harness fuzz {run_id}: {what} {sched.summary()}",
             f"# Replay: ple-harness stress --scenario {path.name} (with the run's engine "
             "arguments, or --url and its facts)",
             "# Order of runs: each distinct prompt alone first (cold, then warm: the warm run is "
             "compared with the cold one), then the phases in order, every request compared "
             "with its prompt's reference taken in this replay.",
             'kind = "replay"',  # the summary may quote (a stop string's tag: stop"..."@J)
             f'description = {json.dumps(f"fuzz {run_id}: {sched.summary()}")}']
    names = []
    for i, (ph, specs) in enumerate(zip(sched.phases, phases), 1):
        n = ph.concurrency + (1 if ph.carrier else 0)
        name = f"fuzz-p{i}-C{ph.concurrency}" + (f"-D{len(ph.inserts)}" if ph.carrier else "")
        names.append(name)
        lines += ["", "[[params.phases]]", f'name = "{name}"', f"concurrency = {n}"]
        rows = [("", r, s, None, s.max_tokens) for r, s in zip(ph.requests, specs.requests)]
        if ph.carrier:
            rows += _repro_carrier_rows(i, ph, specs, pos, runway, max_model_len)
        lines += _repro_request_lines(ph, rows)
    lines += _repro_failed_lines(failed or [], names)
    write_atomic(path, "\n".join(lines) + "\n")


def _repro_carrier_rows(i: int, ph: FuzzPhase, specs: PhaseSpecs, pos: dict, runway: int,
                        max_model_len: int | None) -> list[tuple]:
    """The rows (role note, request, spec, insert_after_tokens or None, max_tokens) of phase
    ``i``'s carrier and its inserts for :func:`write_repro`: an insert at the later of its drawn
    and its sent position (``pos``: (phase, insert) -> (client-seen position, carrier still
    running)); the carrier's max_tokens raised to ``runway`` past the last insert (within
    ``max_model_len`` when known), and each insert kept below the carrier's max_tokens."""
    ins = []
    for j, (x, (s, _)) in enumerate(zip(ph.inserts, specs.inserts)):
        at, role = x.at, f"insert after {x.at} carrier tokens, "
        seen, running = pos.get((i, j), (None, False))
        if seen is not None and running and seen > at:
            at = seen
            role = (f"insert after {at} carrier tokens (drawn {x.at}; sent at "
                    f"client-seen carrier position {seen} in the failing run), ")
        ins.append([role, x.request, s, at])
    cmt = specs.carrier.max_tokens
    want = max([a for *_, a in ins], default=0) + runway if ins else cmt
    if max_model_len:
        want = min(want, int(max_model_len) - len(specs.carrier.prompt))
    role = "carrier decode, "
    if want > cmt:
        role = (f"carrier decode (max_tokens {cmt} in the failing run, {want} here: "
                f"{want - max(a for *_, a in ins)} tokens past the last insert, so it "
                "lands while the carrier runs), ")
        cmt = want
    for x in ins:
        x[3] = min(x[3], cmt - 1)
    return [(role, ph.carrier, specs.carrier, None, cmt)] + \
        [(a, b, c, d, c.max_tokens) for a, b, c, d in ins]


def _repro_request_lines(ph: FuzzPhase, rows: list[tuple]) -> list[str]:
    """The ``[[params.phases.requests]]`` TOML lines of one phase's ``rows`` (role note,
    request, spec, insert_after_tokens or None, max_tokens) for :func:`write_repro`."""
    lines: list[str] = []
    for role, r, s, at, mt in rows:
        note = (f"{role}{r.source} len {r.length} ({r.why}); max_tokens "
                f"{r.max_tokens}").replace('"', "'")
        lines += ["", "[[params.phases.requests]]",
                  f"prompt = {json.dumps(list(s.prompt.ids))}",
                  f"max_tokens = {mt}", f"stream = {str(r.stream).lower()}"]
        if s.temperature > 0:
            lines += [f"temperature = {s.temperature!r}", f"seed = {s.seed}"]
        lines += toml_lines(s)
        if at is not None:
            lines += [f"insert_into = {len(ph.requests)}", f"insert_after_tokens = {at}"]
        lines.append(f'note = "{note}"')
    return lines


def _repro_failed_lines(failed: list, names: list[str]) -> list[str]:
    """The ``[[params.failed]]`` TOML lines of ``failed``
    (:meth:`~.example.FuzzExamples._failed`'s rows), each phase named by ``names`` (1-based; any
    other phase is ``references``)."""
    lines: list[str] = []
    for f in failed:
        ph = f.get("phase")
        name = names[ph - 1] if isinstance(ph, int) and 0 < ph <= len(names) else "references"
        lines += ["", "[[params.failed]]", f'phase = "{name}"']
        if f.get("request") is not None and name != "references":
            lines.append(f"request = {int(f['request'])}")
        for key in ("prompt_len", "max_tokens", "first_divergence", "expected_token",
                    "observed_token"):
            if f.get(key) is not None:
                lines.append(f"{key} = {int(f[key])}")
        for key in ("run", "compared_with", "detail"):
            if f.get(key):
                lines.append(f"{key} = {json.dumps(str(f[key]))}")
    return lines
