"""``ple-harness explain RUN``: which engine feature each failing divergence of a finished run
depends on.

For every distinct failing (prompt, phase concurrency) of the run (divergences that fail the
verdict: hard, or only under test), the smallest case that still fails is found on the
configuration under test, then replayed on engines that each switch one suspect off:

1. **Cases**, smallest first: the prompt alone (one request in flight); else the prompt with its
   phase companions at the phase's concurrency (the whole phase as it ran). A level "fails" when
   any of its requests differs from that engine's own single-request reference (each prompt run
   alone twice first, the second, warm, run kept: the stress run's rule), in any of ``tries``
   attempts (batching is not perfectly repeatable).
2. **Suspects**, chosen from the run's engine facts and launch: speculative decoding (drop
   ``--speculative-config``), prefix caching (``--no-enable-prefix-caching``), chunked prefill (a
   budget of max_model_len tokens, so any prompt prefills in one step), and on GPUs CUDA graphs
   (``--enforce-eager``) and FULL graphs (``--compilation-config {"cudagraph_mode": "PIECEWISE"}``);
   plus every ``--suspect ARG`` (an engine argument appended to the launch).
   Suspects know their relations: FULL CUDA graphs (PIECEWISE) is *within* CUDA graphs
   (``--enforce-eager``); a chunk budget within chunked prefill; k within speculative decoding.
3. **Second round** (from the first round's results, budget permitting): for every two features a
   case needs, the fourth cell of their 2x2 table (both off); for every feature a case needs that
   has a numeric setting (num_speculative_tokens k, max_num_batched_tokens C, block size B), one
   or two other values (k - 1 and k + 1; C / 2 and 2 C; B / 2 or 2 B), each replaying the case as it is
   and with its prompt resized to the boundary length re-derived for the new value (L = 1 + k:
   L = 4 at k = 3 becomes L = 3 at k = 2; :func:`rederive_length`).
4. **Diagnosis per case** (:func:`narrow_down`), as a maintainer writes it in a PR: every
   condition it needs (vanishes when X is off and also when Y is off: "needs X AND Y", an
   interaction, with what the 2x2 table says), the narrowest single change that removes it
   (``cudagraph_mode=PIECEWISE`` rather than ``--enforce-eager``), what is not involved (features
   whose switching off leaves it failing) and whether the trigger moves with a numeric setting
   ("the trigger moves with k: L=3 at k=2, L=4 at k=3, L=5 at k=4"); "persists in every control:
   not explained" when nothing removes it.

One engine per configuration serves all cases (launches = 1 + suspects, then the second round's;
each is printed before it starts). ``budget_s`` caps the time: configurations not started in time
are reported as skipped.
Outputs in ``RUN/explain/``: ``explain.json``, ``explain.md``, ``junit.xml`` (a test case per
divergence; the failure message names the suspect) and ``repro-N.toml`` for each case: a
``replay`` scenario file that ``ple-harness stress --scenario FILE`` replays. The report is an
:class:`ExplainReport` (``explain.json`` is its :meth:`ExplainReport.to_dict`); its console,
Markdown and JUnit renderings are in :mod:`pleharness.render.explain`.

Every engine (the configuration under test, each suspect, the reproducers' fresh engines) runs in
one :class:`~pleharness.engine.session.EngineSession`: a suspect is a
:class:`~pleharness.engine.session.Variant` of the run's launch (the mechanism of ``stress``'s
control and reference engines); SIGINT / SIGTERM stop the engine and end explain with exit
130 / 143.
"""
from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from .engine.client import EngineClient
from .engine.session import EngineSession, Target, Variant
from .engine.side_by_side import SideBySide, model_bytes, run_side_by_side
from .engine.side_by_side import plan as plan_side_by_side
from .errors import EngineError, UsageError
from .files import private_dir
from .manifest import Manifest, load_manifest, write_atomic
from .redact import redact_argv
from .divergence import DEFAULT_NEAR_TIE_NATS, margins
from .parity import token_hash
from .run.judge import Rule, compare_outputs
from .explain_plan import estimate, implied_by, order_first_round

PIECEWISE = '{"cudagraph_mode": "PIECEWISE"}'


@dataclass
class Suspect:
    """One control configuration: the launch arguments with ``drop`` removed and ``add`` added.

    Relations (issue 23): ``feature`` is the engine feature the change belongs to (default: the
    suspect's own name); ``within`` names the broader suspect whose change includes this one
    (FULL CUDA graphs within CUDA graphs; a chunk budget or k within its feature): a suspect is
    narrower the longer its ``within`` chain. ``change`` is the change in a maintainer's words
    (e.g. ``cudagraph_mode=PIECEWISE``). ``setting`` marks a numeric variant: ``{"fact",
    "symbol", "from", "to"}`` (e.g. num_speculative_tokens k 3 -> 2): its replays re-derive the
    case's prompt length for the new value. ``combines`` lists the suspects a 2x2 cell switches
    off together.
    """

    name: str
    why: str
    add: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    feature: str = ""
    within: str | None = None
    change: str = ""
    setting: dict[str, Any] | None = None
    combines: list[str] = field(default_factory=list)

    @property
    def variant(self) -> Variant:
        """This suspect's launch: the run's with ``drop`` removed and ``add`` appended."""
        return Variant.of(drop=self.drop, add=self.add)

    def __post_init__(self) -> None:
        self.feature = self.feature or self.name
        self.change = self.change or " ".join([*(f"no {d}" for d in self.drop
                                                if not any(a.split("=", 1)[0] == d
                                                           for a in self.add)), *self.add]
                                ) or f"{self.name} off"


@dataclass
class Case:
    """A failing (prompt, concurrency) of the run and its replay levels.

    ``levels``: name -> (concurrency, [(prompt ids, max_tokens)]), smallest first.
    ``results``: suspect name -> replay result on that suspect's engine (``fails``,
    ``vanishes``; numeric variants also ``length``/``new_length`` and ``at_new_length``).
    """

    index: int
    prompt_hash: str
    concurrency: int
    phase: str
    requests: list[str]
    first_divergence: int | None
    levels: dict[str, tuple[int, list[tuple[list[int], int]]]]
    minimal: str | None = None
    baseline: dict[str, Any] = field(default_factory=dict)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    prompt_len: int | None = None

    def attribution(self, suspects: Sequence[Suspect] | None = None) -> str:
        """The diagnosis in one line, as a maintainer would write it in a PR (see
        :func:`narrow_down`); ``suspects`` give the relations (default: each result its own
        feature)."""
        if self.minimal is None:
            return "not reproduced on the configuration under test"
        if suspects is None:
            suspects = [Suspect(n, "") for n in self.results]
        return narrow_down(self, suspects)["summary"]


def _facts(m: Manifest) -> dict[str, Any]:
    return m.fact_values()


def _arg_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``args`` (``--flag V`` or ``--flag=V``, the last one wins), or
    None when absent."""
    val = None
    for i, a in enumerate(args):
        name, eq, v = a.partition("=")
        if name == flag:
            val = v if eq else (args[i + 1] if i + 1 < len(args)
                                and not args[i + 1].startswith("--") else "")
    return val


def suspects_for(m: Manifest, extra: Sequence[str] = (), drops: Sequence[str] = (),
                 auto: bool = True) -> list[Suspect]:
    """The suspects worth switching off for this run (module docstring), from its facts
    (``auto``), then one per ``extra`` engine argument (appended) and one per ``drops`` flag
    (removed with its value). Related suspects say so: FULL CUDA graphs (PIECEWISE) is
    ``within`` CUDA graphs (``--enforce-eager``)."""
    f = _facts(m)
    args = list(m.engine.get("launch", {}).get("engine_args") or [])
    out = []
    if not auto:
        f, args, m = {"prefix_caching": False}, [], Manifest(run_id=m.run_id)
    if f.get("num_speculative_tokens") or any(a.startswith("--speculative-config") for a in args):
        out.append(Suspect("speculative decoding", "num_speculative_tokens "
                           f"{f.get('num_speculative_tokens')}", drop=["--speculative-config"],
                           change="no --speculative-config"))
    if f.get("prefix_caching") is not False:
        out.append(Suspect("prefix caching", "prefix caching on",
                           add=["--no-enable-prefix-caching"], drop=["--enable-prefix-caching"],
                           change="--no-enable-prefix-caching"))
    c, mlen = f.get("max_num_batched_tokens"), f.get("max_model_len")
    if mlen and (c is None or int(c) < int(mlen)):
        out.append(Suspect("chunked prefill", f"chunk budget {c} < max_model_len {mlen}",
                           add=[f"--max-num-batched-tokens={mlen}"],
                           drop=["--max-num-batched-tokens"],
                           change=f"max_num_batched_tokens={mlen} (max_model_len: no chunking)"))
    if m.environment.get("gpus"):
        out.append(Suspect("CUDA graphs", "GPU run", add=["--enforce-eager"],
                           change="--enforce-eager"))
        out.append(Suspect("FULL CUDA graphs", "GPU run",
                           add=[f"--compilation-config={PIECEWISE}"],
                           drop=["--compilation-config", "-O"], feature="CUDA graphs",
                           within="CUDA graphs", change="cudagraph_mode=PIECEWISE"))
    for a in extra:
        out.append(Suspect(a, "--suspect", add=[a]))
    for d in drops:
        out.append(Suspect(f"without {d}", "--suspect-drop", drop=[d]))
    return out


def numeric_variants(m: Manifest, feature: str) -> list[Suspect]:
    """One or two other values of the numeric setting behind ``feature`` (each ``within`` it),
    or [].

    speculative decoding: num_speculative_tokens k - 1 (when >= 1) and k + 1 (the launch's
    ``--speculative-config`` JSON rewritten); chunked prefill: max_num_batched_tokens C / 2
    (when >= 16) and 2 C; prefix caching: block size B / 2 (when >= 16, else 2 B). Values come
    from the run's facts; a setting that cannot be read gives no variants."""
    f = _facts(m)
    args = list(m.engine.get("launch", {}).get("engine_args") or [])
    out = []

    def variant(fact: str, sym: str, old: int, new: int, add: list[str], drop: str) -> Suspect:
        return Suspect(f"{fact}={new}", f"{sym} {old} -> {new}", add=add, drop=[drop],
                       feature=feature, within=feature, change=f"{fact}={new}",
                       setting={"fact": fact, "symbol": sym, "from": old, "to": new})

    if feature == "speculative decoding" and f.get("num_speculative_tokens"):
        k = int(f["num_speculative_tokens"])
        try:
            cfg = json.loads(_arg_value(args, "--speculative-config") or "")
        except ValueError:
            cfg = None
        if isinstance(cfg, dict):
            for v in [x for x in (k - 1, k + 1) if x >= 1]:
                js = json.dumps({**cfg, "num_speculative_tokens": v})
                out.append(variant("num_speculative_tokens", "k", k, v,
                                   [f"--speculative-config={js}"], "--speculative-config"))
    if feature == "chunked prefill" and f.get("max_num_batched_tokens"):
        c = int(f["max_num_batched_tokens"])
        for v in [x for x in (c // 2, 2 * c) if x >= 16]:
            out.append(variant("max_num_batched_tokens", "C", c, v,
                               [f"--max-num-batched-tokens={v}"], "--max-num-batched-tokens"))
    if feature == "prefix caching" and f.get("block_size"):
        b = int(f["block_size"])
        v = b // 2 if b // 2 >= 16 else 2 * b
        out.append(variant("block_size", "B", b, v, [f"--block-size={v}"], "--block-size"))
    return out


def two_by_two(x: Suspect, y: Suspect) -> Suspect:
    """The fourth cell of the 2x2 table of two suspects (the other three: under test, ``x`` off,
    ``y`` off): both switched off together."""
    return Suspect(f"{x.name} + {y.name} off", "2x2 table", add=[*x.add, *y.add],
                   drop=[*x.drop, *y.drop], feature="2x2", change=f"{x.change} and {y.change}",
                   combines=[x.name, y.name])


def follow_ups(m: Manifest, suspects: Sequence[Suspect],
               cases: Sequence["Case"]) -> list[Suspect]:
    """The second round, from the first round's results: the 2x2 cell (both off) of every pair of
    conditions some case needs together, then the numeric variants (:func:`numeric_variants`)
    of every feature some case needs. Each once, in that order (the budget cuts the last)."""
    out: list[Suspect] = []
    by_name = {s.name: s for s in suspects}
    analyses = [narrow_down(c, suspects) for c in cases if c.minimal is not None]
    for n in analyses:
        conds = [by_name[k["suspect"]] for k in n["conditions"]]
        out += [two_by_two(x, y) for i, x in enumerate(conds) for y in conds[i + 1:]]
    for n in analyses:
        for k in n["conditions"]:
            out += numeric_variants(m, k["feature"])
    seen: set[str] = set()
    return [s for s in out if not (s.name in seen or seen.add(s.name))]


_FORMULA = re.compile(r"^(q = 1 \+ k|n\*[BCA] \+ q) = (?:(\d+)\*)?.*?(?: ([-+]) 1 \(control\))?$")


def rederive_length(facts: dict[str, Any], length: int, fact: str,
                    value: int) -> tuple[int, str] | None:
    """The boundary length that plays the role of ``length`` once ``fact`` is ``value``:
    ``length``'s boundary formula (:func:`~pleharness.scenarios.shared.lengths.boundary_lengths`:
    q = 1 + k, n*B + q, n*C + q, n*A + q, or a +-1 control of one) evaluated with the new value.
    E.g. L = 4 = q at k = 3 is L = 3 at k = 2. Returns (new length, the formula as the original
    facts spell it), or None when no boundary formula gives ``length`` (a length not derived
    from the facts: the case is then replayed as it is)."""
    from .scenarios.shared.lengths import boundary_lengths
    depth = 8
    found = {b.length: b for b in boundary_lengths(facts, depth)[0]}
    if length not in found:
        return None
    new = boundary_lengths({**facts, fact: value}, depth)[0]
    keys: dict[tuple, int] = {}
    for b in new:
        for r in b.reasons:
            mt = _FORMULA.match(r)
            if mt:
                keys.setdefault(mt.groups(), b.length)
    fam = {"block_size": "n*B", "max_num_batched_tokens": "n*C"}.get(fact, "")
    # the formula that uses the changed fact first (260 = 8*32 + 4 = 1*256 + 4), controls last
    for r in sorted(found[length].reasons, key=lambda r: (not r.startswith(fam),
                                                          "(control)" in r)):
        mt = _FORMULA.match(r)
        if mt and mt.groups() in keys:
            return keys[mt.groups()], r
    return None


def resize_prompt(ids: Sequence[int], n: int) -> list[int]:
    """``ids`` made exactly ``n`` tokens long in the middle, head and tail kept (a chat prompt
    keeps its template's ends): tokens removed from the middle, or the middle token repeated."""
    ids = list(ids)
    if n >= len(ids):
        mid = len(ids) // 2
        return ids[:mid] + [ids[mid]] * (n - len(ids)) + ids[mid:]
    head = (n + 1) // 2
    return ids[:head] + ids[len(ids) - (n - head):] if n - head else ids[:head]


def _depth(s: Suspect, by_name: dict[str, Suspect]) -> int:
    d, seen = 0, {s.name}
    while s.within and s.within in by_name and s.within not in seen:
        s = by_name[s.within]
        seen.add(s.name)
        d += 1
    return d


def narrow_down(case: "Case", suspects: Sequence[Suspect]) -> dict[str, Any]:
    """What the case's replays on the suspects' engines say, as a maintainer needs it (issue 23).

    Returns a dict:

    - ``conditions``: one per feature whose switching off makes the divergence vanish, each
      ``{"feature", "suspect", "change"}`` with the narrowest such suspect of that feature (FULL
      CUDA graphs rather than CUDA graphs when PIECEWISE is enough). Two or more: an
      interaction, the divergence needs them all ("needs X AND Y").
    - ``interaction``: ``{"features", "confirmed"}`` from the 2x2 table when its both-off cell
      ran (``confirmed``: it vanishes there too, so it fails only with both on; ``False`` when it
      fails with both off: the three other cells then do not add up), None without one.
    - ``narrowest``: the narrowest single changes that make it vanish (longest ``within`` chain
      first; ties all listed; a numeric variant counts only when the divergence vanishes at the
      re-derived length too, not when the trigger just moved).
    - ``not_involved``: features whose every suspect ran and left it failing.
    - ``untested``: features with a suspect skipped (budget) or not started (error).
    - ``numeric``: per numeric setting tried, ``{"fact", "symbol", "points": [{value, length,
      fails}], "moves"}`` with ``moves`` True (fails at the re-derived length and not at the old
      one for every value tried), False (still fails at the old length) or None (neither).
    - ``inconsistent``: notes where a narrower change vanishes and its broader one does not.
    - ``summary``: the one-line diagnosis.
    """
    by_name = {s.name: s for s in suspects}
    res = case.results
    out: dict[str, Any] = {"conditions": [], "interaction": None, "narrowest": [],
                           "not_involved": [], "untested": [], "numeric": [],
                           "inconsistent": []}
    if case.minimal is None:
        out["summary"] = "not reproduced on the configuration under test"
        return out
    plain = [s for s in suspects if not s.setting and not s.combines]
    features = list(dict.fromkeys(s.feature for s in plain))
    vanish = [s for s in suspects if not s.combines and res.get(s.name, {}).get("vanishes")]
    for feat in features:
        mine = [s for s in plain if s.feature == feat]
        gone = [s for s in vanish if s.feature == feat and not s.setting]
        ran = [s for s in mine if "fails" in res.get(s.name, {})]
        if gone:
            best = max(gone, key=lambda s: _depth(s, by_name))
            out["conditions"].append({"feature": feat, "suspect": best.name,
                                      "change": best.change})
        elif len(ran) == len(mine):
            out["not_involved"].append(feat)
        else:
            out["untested"].append(feat)
    for s in vanish:
        parent = by_name.get(s.within or "")
        if parent and not parent.setting and res.get(parent.name, {}).get("vanishes") is False:
            out["inconsistent"].append(f"vanishes with {s.change} but not with {parent.change}")
    if vanish:
        top = max(_depth(s, by_name) for s in vanish)
        out["narrowest"] = [s.name for s in vanish if _depth(s, by_name) == top]
    conds = [c["suspect"] for c in out["conditions"]]
    for s in suspects:
        if s.combines and set(s.combines) <= set(conds) and "fails" in res.get(s.name, {}):
            out["interaction"] = {"features": list(s.combines),
                                  "confirmed": not res[s.name]["fails"], "cell": s.name}
    out["numeric"] = _numeric_settings(case, suspects)
    out["summary"] = _summary(out, by_name)
    return out


def _numeric_settings(case: "Case", suspects: Sequence[Suspect]) -> list[dict[str, Any]]:
    """:func:`narrow_down`'s ``numeric``: per numeric setting whose suspects ran, ``{"fact",
    "symbol", "formula", "points": [{value, length, fails, fails_as_run}] (sorted by value; the
    first the configuration under test), "moves"}`` (True / False / None as documented
    there)."""
    settings: dict[str, dict[str, Any]] = {}
    res = case.results
    for s in suspects:
        r = res.get(s.name, {})
        if not s.setting or "fails" not in r:
            continue
        st = settings.setdefault(s.setting["fact"], {
            "fact": s.setting["fact"], "symbol": s.setting["symbol"], "formula": r.get("formula"),
            "points": [{"value": s.setting["from"], "length": case.prompt_len, "fails": True,
                        "fails_as_run": True}],
            "old_length_fails": []})
        st["points"].append({"value": s.setting["to"], "length": r.get("new_length"),
                             "fails": r.get("fails_at_new_length", r["fails"]),
                             "fails_as_run": r["fails"]})
        st["old_length_fails"].append(r["fails"])
    for st in settings.values():
        moved = [p for p in st["points"][1:] if p["length"] != case.prompt_len]
        if any(st["old_length_fails"]):
            st["moves"] = False
        elif moved and len(moved) == len(st["points"]) - 1 and all(p["fails"] for p in moved):
            st["moves"] = True
        else:
            st["moves"] = None
        st["points"].sort(key=lambda p: p["value"])
        del st["old_length_fails"]
    return list(settings.values())


def _numeric_text(st: dict[str, Any]) -> str:
    pts = ", ".join(f"L={p['length']} at {st['symbol']}={p['value']}" for p in st["points"])
    if st["moves"]:
        return f"the trigger moves with {st['symbol']}: {pts}" + (
            f" ({st['formula']})" if st.get("formula") else "")
    if st["moves"] is False:
        return (f"the trigger does not move with {st['symbol']}: the same prompt still fails at "
                f"{st['symbol']}=" + ", ".join(str(p["value"]) for p in st["points"]))
    sym = st["symbol"]
    same = len({p["length"] for p in st["points"]}) == 1
    val = lambda ps: ", ".join(  # noqa: E731
        str(p["value"]) + ("" if same else f" (L={p['length']})") for p in ps)
    return (f"fails only at {sym}={val([p for p in st['points'] if p['fails']])}, passes at "
            f"{sym}={val([p for p in st['points'] if not p['fails']])}"
            + (f" (the same prompt, L={st['points'][0]['length']})" if same else ""))


def _summary(n: dict[str, Any], by_name: dict[str, Suspect]) -> str:
    conds = n["conditions"]
    names = [c["suspect"] for c in conds]
    if not conds:
        head = ("persists in every control that ran (some skipped: budget)" if n["untested"]
                else "persists in every control: not explained")
    elif len(conds) == 1:
        head = f"needs {names[0]}"
    else:
        head = "needs " + " AND ".join(names)
        it = n["interaction"]
        head += (" (interaction; 2x2: fails only with both on)" if it and it["confirmed"] else
                 " (interaction; 2x2: ALSO FAILS with both off, so the cells do not add up)"
                 if it else " (interaction; 2x2 both-off cell not run)")
    parts = [head]
    if n["narrowest"]:
        parts.append("narrowest single change: " + " or ".join(
            by_name[x].change if x in by_name else x for x in n["narrowest"]))
    if n["not_involved"]:
        parts.append("not involved: " + ", ".join(n["not_involved"]))
    if n["untested"]:
        parts.append("not tested: " + ", ".join(n["untested"]))
    parts += [_numeric_text(st) for st in n["numeric"]]
    parts += n["inconsistent"]
    return "; ".join(parts)


def failing_cases(m: Manifest, include_warnings: bool = False) -> list[Case]:
    """One case per distinct (prompt, phase concurrency) whose divergence fails the run (with
    ``include_warnings``: every divergence, near ties and also_in_control ones too).

    Raises UsageError when the run kept no prompt IDs for them (runs before prompt keeping)."""
    groups: dict[tuple[str, int], list] = {}
    for r in m.requests:
        if r.divergence and (include_warnings or r.divergence.fails):
            groups.setdefault((r.prompt_hash, r.concurrency), []).append(r)
    cases = []
    for i, ((ph, conc), recs) in enumerate(sorted(groups.items(), key=lambda kv: kv[1][0].id), 1):
        r0 = recs[0]
        if ph not in m.prompts:
            raise UsageError(f"{m.run_id}: the manifest keeps no prompt IDs for {r0.prompt_key}; "
                             "rerun with this version of ple-harness to explain it")
        levels = {"alone": (1, [(m.prompts[ph], r0.max_tokens)])}
        phase = [q for q in m.requests if q.phase == r0.phase and q.prompt_hash in m.prompts]
        if conc > 1 and len(phase) > 1:
            levels["with its phase companions"] = (conc, [(m.prompts[q.prompt_hash], q.max_tokens)
                                                          for q in phase])
        cases.append(Case(i, ph, conc, r0.phase, [q.id for q in recs], r0.first_divergence,
                          levels, prompt_len=len(m.prompts[ph])))
    return cases


def run_target(m: Manifest, python: str | None = None,
               start_timeout_s: float = 900.0) -> Target:
    """The explained run's engine as a launch target, from its manifest's launch record (model,
    python (``python`` overrides it), tp, engine_args, env, host; the served name): a value
    recorded as ``<redacted>`` is taken from this process's environment."""
    la = m.engine.get("launch") or {}
    env = {k: (os.environ.get(k, "") if v == "<redacted>" else v)
           for k, v in (la.get("env") or {}).items()}
    return Target(url=None, model_path=la["model"], served_name=m.engine.get("model"),
                  python=python or la["python"], tp=la.get("tp", 1),
                  engine_args=list(la.get("engine_args") or []), engine_env=env,
                  host=la.get("host", "127.0.0.1"), start_timeout_s=start_timeout_s)


class _RunGolden:
    """The explained run's golden model, used as the run's judge used it, so that a replay
    fails exactly where the run did. Seen on the H200 (docs/gpu-runs/2026-12-03-o-issue33): on a
    random-weight bf16 model, a planted fault at a position whose engine margin was 0.004 nats
    was hard by the golden model in the run, while explain's replays, judged by the engine
    margin alone, called the same divergence a near tie: "not reproduced on the configuration
    under test" beside its own reproducer confirmed 3/3 on fresh engines.

    ``floor``: the run's measured half-precision golden floor (``run_options.golden_tolerance``);
    ``error``: why the golden model stopped being asked (the engine margin decides then, as in
    the run). The worker starts on the first divergence (:class:`pleharness.golden.GoldenModel`)."""

    def __init__(self, model: Any, floor: dict[str, Any] | None):
        self.model, self.floor = model, floor
        self.error: str | None = None

    @classmethod
    def of_run(cls, m: Manifest, target: Target, out_dir: Path) -> tuple["_RunGolden | None", str]:
        """The run's golden model (its folder from ``run_options.golden_model``, else the
        launched model; the engine's Python), or None where the run had none; and what
        explain.json says about it."""
        from .golden import GoldenModel, golden_problem
        ro = m.run_options
        used = str(ro.get("golden_classifier") or "")
        if ro.get("golden") is False or not used.startswith("transformers"):
            return None, f"none (the run's golden classifier: {used or 'not recorded'})"
        model_dir = ro.get("golden_model") or target.model_path
        problem = golden_problem(model_dir)
        if problem:
            return None, f"unavailable: {problem}"
        return (cls(GoldenModel(model_dir, target.python, log_path=out_dir / "golden.log"),
                    ro.get("golden_tolerance")),
                f"the run's: transformers float32 on {model_dir}")

    def evidence(self, prompt: Sequence[int], reference: Sequence[int],
                 observed: Sequence[int]) -> Any:
        """``golden_at`` for :func:`pleharness.divergence.compare_outputs`: the teacher-forced
        golden logprobs of both tokens at a divergent position, or None."""
        from .golden import GoldenError

        def at(pos: int) -> dict[str, Any] | None:
            if self.error is not None or pos >= min(len(reference), len(observed)):
                return None
            try:
                lps, top = self.model.score(list(prompt), list(observed[:pos]),
                                            [reference[pos], observed[pos]])
            except GoldenError as exc:
                self.error = str(exc)
                return None
            return {"logprobs": lps, "top": top}
        return at

    def close(self) -> None:
        self.model.close()


class _Replayer:
    """Runs case levels on one engine and judges them against that engine's own warm solo
    references (cached per prompt) by the run's own rule (:func:`pleharness.run.judge.
    compare_outputs`: the near-tie threshold, ``--strict`` and logprobs the run used, from its
    ``run_options``), so a replay fails exactly where the run it explains would: a hard
    divergence fails, a near tie only when ``count_warnings`` (``--include-warnings``). With
    ``golden`` (:class:`_RunGolden`), its golden model and measured half-precision floor weigh
    in exactly as they did in the run (:func:`pleharness.divergence.settle`)."""

    def __init__(self, client: EngineClient, rule: Rule = Rule(), logprobs: int | None = 2,
                 count_warnings: bool = False, golden: "_RunGolden | None" = None):
        self.client = client
        self.rule = rule
        self.logprobs = logprobs
        self.count_warnings = count_warnings
        self.golden = golden
        self.refs: dict[tuple[str, int], tuple[list[int], list | None]] = {}

    @classmethod
    def for_run(cls, client: EngineClient, m: Manifest, count_warnings: bool,
                golden: "_RunGolden | None" = None) -> "_Replayer":
        """The replayer of run ``m``: its near-tie threshold, strictness, logprobs, serving
        dtype, and (``golden``) its golden model and measured golden floor."""
        ro = m.run_options
        rule = Rule(near_tie_nats=float(ro.get("near_tie_nats") or DEFAULT_NEAR_TIE_NATS),
                    strict=bool(ro.get("strict")), serving_dtype=ro.get("serving_dtype"))
        return cls(client, rule, ro.get("logprobs", 2) or None, count_warnings, golden)

    def _solo(self, ids: list[int], mt: int) -> tuple[list[int], list | None]:
        key = (token_hash(ids), mt)
        if key not in self.refs:
            self.client.complete(ids, mt, logprobs=self.logprobs)  # cold run: discarded
            c = self.client.complete(ids, mt, logprobs=self.logprobs)
            if c.error:
                raise EngineError(f"reference request failed: {c.error}: {c.error_detail}")
            self.refs[key] = (list(c.token_ids), margins(c.logprobs))
        return self.refs[key]

    def run(self, level: tuple[int, list[tuple[list[int], int]]], tries: int) -> dict[str, Any]:
        """Replay ``level`` (concurrency, [(prompt IDs, max_tokens)]) up to ``tries`` times,
        until a try fails. Returns {"fails", "tries", "divergent": up to 8 failing comparisons
        (try, prompt_len, first_divergence, class, output and reference hashes)}."""
        conc, reqs = level
        refs = [self._solo(ids, mt) for ids, mt in reqs]
        seen = []
        for t in range(1, tries + 1):
            async def one(r, cl=self.client, lp=self.logprobs):
                return await cl.acomplete(r[0], r[1], logprobs=lp)
            # the client's batch path: exactly ``conc`` in flight on its event loop
            outs = self.client.run_batch(reqs, conc, one).wait()
            for (ids, _), (ref, ref_margins), c in zip(reqs, refs, outs):
                if c.error is not None:
                    continue
                d = compare_outputs(
                    ref, c.token_ids, self.rule, ref_margins,
                    golden_at=self.golden.evidence(ids, ref, c.token_ids) if self.golden else None,
                    golden_floor=self.golden.floor if self.golden else None)
                if d is not None and (d.fails or self.count_warnings):
                    seen.append({"try": t, "prompt_len": len(ids),
                                 "first_divergence": d.position, "class": d.cls,
                                 "decided_by": d.decided_by,
                                 "output_hash": token_hash(c.token_ids)[:16],
                                 "reference_hash": token_hash(ref)[:16]})
            if seen:
                break
        return {"fails": bool(seen), "tries": t, "divergent": seen[:8]}


def write_repro(case: Case, path: Path, run_id: str) -> None:
    """The case's minimal failing level as a ``replay`` scenario file, with the comparisons that
    failed there (``[[params.failed]]``: which request, compared with that engine's own warm
    single-request reference, first divergent position; :mod:`pleharness.scenarios.replay`)."""
    name = case.minimal or "with its phase companions"
    conc, reqs = case.levels.get(name) or case.levels["alone"]
    phase = f"case{case.index}-{name.replace(' ', '-')}"
    conc = min(conc, len(reqs))  # a phase never has more in flight than it has requests
    lines = [f"# ple-harness explain {run_id}, case {case.index}: {case.phase} (C{case.concurrency}),"
             f" requests {', '.join(case.requests)}",
             f"# minimal failing level: {name}. Replay: ple-harness stress --scenario {path.name} "
             "(with the run's engine arguments)",
             'kind = "replay"', f'description = "explain case {case.index}: {name}"', "",
             "[[params.phases]]", f'name = "{phase}"',
             f"concurrency = {conc}"]
    for ids, mt in reqs:
        lines += ["", "[[params.phases.requests]]", f"prompt = {json.dumps(ids)}",
                  f"max_tokens = {mt}"]
    lines += _failed_lines(case, name, phase, reqs)
    write_atomic(path, "\n".join(lines) + "\n")


def _applies(sus: Suspect, case: Case, first: Sequence[Suspect]) -> bool:
    """Whether ``case`` is replayed on ``sus``'s engine: every first-round suspect for a case that
    reproduced; a 2x2 cell for a case that needs both of its suspects; a numeric variant for a case
    that needs its feature."""
    if case.minimal is None:
        return False
    if not (sus.setting or sus.combines):
        return True
    n = narrow_down(case, first)
    if sus.combines:
        return set(sus.combines) <= {k["suspect"] for k in n["conditions"]}
    return sus.feature in {k["feature"] for k in n["conditions"]}


def _replay_suspect(rp: "_Replayer", sus: Suspect, c: Case, m: Manifest,
                    tries: int) -> dict[str, Any]:
    """The case's minimal level on ``sus``'s engine; for a numeric variant also with the case's
    prompt resized to its boundary length re-derived for the new value (:func:`rederive_length`).
    ``vanishes``: it fails at neither length."""
    level = c.levels[c.minimal]
    res = rp.run(level, tries)
    out = {**res, "vanishes": not res["fails"]}
    if not sus.setting or c.prompt_len is None:
        return out
    new = rederive_length(_facts(m), c.prompt_len, sus.setting["fact"], sus.setting["to"])
    out.update(length=c.prompt_len, new_length=c.prompt_len if new is None else new[0],
               formula=None if new is None else new[1])
    if new is None or new[0] == c.prompt_len:
        out["fails_at_new_length"] = res["fails"]
        return out
    ids = m.prompts[c.prompt_hash]
    conc, reqs = level
    resized = (conc, [(resize_prompt(q, new[0]) if q == ids else q, mt) for q, mt in reqs])
    r2 = rp.run(resized, tries)
    out.update(at_new_length=r2, fails_at_new_length=r2["fails"],
               vanishes=not res["fails"] and not r2["fails"])
    return out


def _failed_lines(case: Case, level: str, phase: str, reqs: list) -> list[str]:
    """``[[params.failed]]`` entries for a case's reproducer: the divergent requests of its
    minimal level on the configuration under test (each against that engine's warm solo
    reference: its 2nd solo run), else the run's own first divergence."""
    seen = (case.baseline.get(level) or {}).get("divergent") or []
    out: list[str] = []
    lens = [len(ids) for ids, _ in reqs]
    for d in seen[:8]:
        j = lens.index(d["prompt_len"]) if d.get("prompt_len") in lens else None
        out += ["", "[[params.failed]]", f'phase = "{phase}"']
        if j is not None:
            out.append(f"request = {j}")
        out += [f"prompt_len = {int(d['prompt_len'])}", 'run = "load (explain replay, try '
                f'{int(d.get("try") or 1)})"',
                'compared_with = "its warm single-request reference on the same engine (2nd '
                'solo run; the cold 1st run discarded)"']
        if d.get("first_divergence") is not None:
            out.append(f"first_divergence = {int(d['first_divergence'])}")
    if not seen:
        out += ["", "[[params.failed]]", f'phase = "{phase}"',
                f'run = "load ({case.phase}, C{case.concurrency}, requests '
                f'{", ".join(case.requests[:4])} of the explained run)"',
                'compared_with = "its single-request reference in the explained run"']
        if case.first_divergence is not None:
            out.append(f"first_divergence = {int(case.first_divergence)}")
    return out


@dataclass
class CaseReport:
    """One case in the report (``explain.json``'s ``cases[]``; :class:`Case` is its working
    state). ``baseline``: level name -> replay result on the configuration under test;
    ``controls``: suspect name -> replay result on its engine; ``narrowing``:
    :func:`narrow_down`'s dict; ``attribution``: the one-line diagnosis; ``repro``: the
    reproducer's path relative to the run folder; ``reproduction`` / ``reproduction_verdict``:
    set by :func:`confirm_repros` (absent from the JSON until then)."""

    case: int
    prompt_hash: str
    concurrency: int
    phase: str
    requests: list[str]
    first_divergence: int | None
    prompt_len: int | None
    minimal_case: str | None
    baseline: dict[str, Any]
    controls: dict[str, dict[str, Any]]
    narrowing: dict[str, Any]
    attribution: str
    repro: str
    reproduction: dict[str, Any] | None = None
    reproduction_verdict: str | None = None

    @classmethod
    def of(cls, c: Case, suspects: Sequence[Suspect], repro: str) -> "CaseReport":
        """The report of a finished :class:`Case`, diagnosed against ``suspects``."""
        return cls(c.index, c.prompt_hash, c.concurrency, c.phase, c.requests,
                   c.first_divergence, c.prompt_len, c.minimal, c.baseline, c.results,
                   narrow_down(c, suspects), c.attribution(suspects), repro)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (field order; the reproduction fields only once set)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None
                or f.name not in ("reproduction", "reproduction_verdict")}


@dataclass
class ExplainReport:
    """What ``ple-harness explain`` found, written as ``RUN/explain/explain.json``
    (:meth:`to_dict`).

    ``tries``: attempts per replay; ``budget_s``: the time cap (seconds); ``suspects``: every
    configuration tried besides the one under test, first round then second, in launch order;
    ``launches``: one dict per configuration, ``config`` (its label) with ``command`` (redacted
    argv) and ``ready_s`` (seconds), or ``skipped`` ("budget", "implied: ...", "not tested
    yet"), or ``error`` and ``root_cause``; ``elapsed_s``: seconds from the first launch to the
    end (None when nothing failed, absent from the JSON then); ``status``: "complete", or how
    far it got ("launch 2 of 4 done", "interrupted (...) after 2 launch(es)");
    ``side_by_side``: :meth:`pleharness.engine.side_by_side.SideBySide.record`; ``estimate``:
    :func:`pleharness.explain_plan.estimate`; ``golden``: the golden model the replays are
    judged with (the run's, :class:`_RunGolden`), or why there is none.
    """

    run_id: str
    tries: int
    budget_s: float
    cases: list[CaseReport] = field(default_factory=list)
    suspects: list[Suspect] = field(default_factory=list)
    launches: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float | None = None
    include_warnings: bool = False  # replays count near ties too (--include-warnings); not in the JSON
    status: str = "starting"
    side_by_side: dict[str, Any] = field(default_factory=dict)
    estimate: dict[str, Any] = field(default_factory=dict)
    golden: str = ""  # the golden model the replays are judged with (the run's), or why none

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``explain.json``."""
        out: dict[str, Any] = {"run_id": self.run_id, "status": self.status,
                               "tries": self.tries, "budget_s": self.budget_s,
                               "estimate": self.estimate, "side_by_side": self.side_by_side,
                               "golden": self.golden,
                               "cases": [c.to_dict() for c in self.cases],
                               "suspects": [asdict(x) for x in self.suspects],
                               "launches": self.launches}
        if self.elapsed_s is not None:
            out["elapsed_s"] = self.elapsed_s
        return out

    def to_json(self) -> str:
        """``explain.json``'s text."""
        return json.dumps(self.to_dict(), indent=1)


def confirm_repros(report: ExplainReport, m: Manifest, run_dir: Path, runs: int, *,
                   engine_python: str | None = None, start_timeout_s: float = 900.0,
                   console: Console | None = None, on_each: Any = None,
                   side: SideBySide | None = None) -> None:
    """Replay every case's ``repro-N.toml`` ``runs`` times, each on a freshly started engine of
    the configuration under test (:mod:`pleharness.reproduce`); each report case gets
    ``reproduction`` (the result) and ``reproduction_verdict`` ("reproduced 3/3 on fresh
    engines", "0/3: not reproduced ..."). Cases whose reproducers replay the same schedule (the
    cases of one phase, at its companions level) are replayed once and share the result
    (``same_schedule_as``). Replays run under ``RUN/explain/confirm/``, ``side.n`` side by side
    (each with ``side.add``); ``on_each()`` is called after every case. Raises Interrupted when
    a replay was interrupted (SIGINT / SIGTERM)."""
    from .reproduce import ReplayTarget, judging_options, replay_reproducer
    from .stress import run_stress
    console = console or Console(stderr=True)
    rt = ReplayTarget(runner=run_stress, launch=run_target(m, engine_python).launch_spec(),
                      **judging_options(m.run_options),
                      start_timeout_s=start_timeout_s, parallel=side.n if side else 1,
                      engine_args_add=list(side.add) if side else [])
    from .scenarios import load_scenario_file
    done: dict[str, tuple[str, dict]] = {}  # schedule key -> (repro, result)
    for c in report.cases:
        path = run_dir / c.repro
        # cases of one phase share its schedule ("with its phase companions"): replayed once
        key = json.dumps([[ph.concurrency, [r.model_dump() for r in ph.requests]]
                          for ph in load_scenario_file(str(path)).params.phases],
                         sort_keys=True)  # phase names carry the case number: not compared
        if key in done:
            first, res = done[key]
            c.reproduction = {**res, "same_schedule_as": first}
            c.reproduction_verdict = f"{res['verdict']} (the schedule of {first})"
            if on_each:
                on_each()
            continue
        console.print(f"confirming {escape(c.repro)}: {runs} replay(s), each on a freshly "
                      "started engine", highlight=False)
        res = replay_reproducer(path, rt, runs, path.parent / "confirm",
                                log=lambda x: console.print(escape(x), highlight=False))
        done[key] = (c.repro, res)
        c.reproduction = res
        c.reproduction_verdict = res["verdict"]
        console.print(f"{escape(c.repro)}: {escape(res['verdict'])}", highlight=False)
        if on_each:
            on_each()


def explain(run: Path, *, suspects_extra: Sequence[str] = (), suspects_drop: Sequence[str] = (),
            auto_suspects: bool = True, include_warnings: bool = False, tries: int = 3,
            budget_s: float = 3600.0, engine_python: str | None = None,
            start_timeout_s: float = 900.0, console: Console | None = None,
            confirm_runs: int = 3, parallel_engines: int | None = 1) -> ExplainReport:
    """Explain the failing divergences of the run at ``run`` (folder or manifest); see the module
    docstring. Returns the report (also written to ``RUN/explain/explain.json``, with
    ``explain.md`` and ``junit.xml``).

    ``confirm_runs``: replays of each reproducer on fresh engines (:func:`confirm_repros`; 0:
    skip). ``parallel_engines``: engines started side by side (None: auto;
    :func:`pleharness.engine.side_by_side.plan`).

    explain.json and explain.md are rewritten after every launch and every confirmation, and
    on SIGINT / SIGTERM, with ``status`` saying how far it got and every launch not reached
    "not tested yet" (a stopped explain keeps what it learned).

    Raises UsageError for a run that cannot be explained (attached engine, nothing failing, no
    prompt IDs kept, more side-by-side engines than fit); EngineError when the configuration
    under test cannot be started; Interrupted on SIGINT / SIGTERM (the engines running then
    are stopped first).
    """
    from .render.explain import render, to_junit
    console = console or Console(stderr=True)
    m, run_dir = _load_run(run)
    cases = failing_cases(m, include_warnings)
    if engine_python is not None:  # a typo must not wait for the first launch
        from .engine.launch import engine_python_check
        problem = engine_python_check(engine_python)
        if problem:
            raise UsageError(f"--engine-python: {problem}")
    unfinished = ""
    if m.status not in ("complete", "control_failed"):
        s = m.summary
        done = f" after {s.phases_completed} of {s.phases_planned} phases" \
            if s.phases_planned else ""
        unfinished = f"the run did not complete (status {m.status!r}{done})"
        if not cases:  # refused before any folder is made or moved
            raise UsageError(f"{run}: {unfinished}: no verdict, nothing to explain")
    out_dir = run_dir / "explain"
    kept = _keep_previous(out_dir)
    if kept is not None:
        console.print(f"the previous explain of this run is kept in {escape(str(kept))}",
                      highlight=False)
    private_dir(out_dir)
    report = ExplainReport(m.run_id, tries, budget_s, include_warnings=include_warnings)
    if unfinished:
        console.print(f"{unfinished}: explaining the {len(cases)} failing case(s) it recorded",
                      highlight=False)
    if not cases:
        console.print("no failing divergences in this run: nothing to explain")
        write_atomic(out_dir / "explain.json", report.to_json())
        return report
    target = run_target(m, engine_python, start_timeout_s)
    from .environment import gpu_inventory
    gpus = gpu_inventory()
    side = plan_side_by_side(parallel_engines, gpus=gpus, model=model_bytes(target.model_path),
                             engine_args=target.engine_args, engine_env=target.engine_env)
    suspects = order_first_round(m, suspects_for(m, suspects_extra, suspects_drop,
                                                 auto_suspects))
    report.suspects = list(suspects)
    report.side_by_side = side.record()
    report.estimate = estimate(m, 1 + len(suspects), side.n, budget_s)
    console.print(f"{len(cases)} failing case(s); {1 + len(suspects)} engine launch(es) planned: "
                  f"the configuration under test, then without: "
                  f"{', '.join(s.name for s in suspects) or '(no suspects)'}", highlight=False)
    console.print(f"estimate: {report.estimate['text']}", highlight=False)
    if side.n > 1:
        console.print(escape(side.why), highlight=False)
    console.print(f"explain.json and explain.md: {escape(str(out_dir))} (rewritten after every "
                  "launch)", highlight=False)
    progress = _Progress(report, cases, out_dir, run_dir)
    golden, report.golden = _RunGolden.of_run(m, target, out_dir)
    t0 = time.monotonic()
    try:
        with EngineSession(console, out_dir, gpus_before=gpus) as session:
            configs = _replay_all(session, target, m, cases, report, budget_s, t0, console,
                                  progress, side, golden)
            for c in cases:
                path = out_dir / f"repro-{c.index}.toml"
                write_repro(c, path, m.run_id)
                report.cases.append(CaseReport.of(c, configs[1:],
                                                  str(path.relative_to(run_dir))))
            if confirm_runs:
                progress.save("confirming the reproducers")
                confirm_repros(report, m, run_dir, confirm_runs, engine_python=engine_python,
                               start_timeout_s=start_timeout_s, console=console,
                               on_each=lambda: progress.save("confirming the reproducers"),
                               side=side)
    except BaseException as exc:
        progress.save(_stopped(exc, report))
        raise
    finally:
        if golden is not None:
            golden.close()
            if golden.error:
                report.golden += f"; stopped: {golden.error}"
    report.elapsed_s = round(time.monotonic() - t0, 1)
    progress.save("complete")
    write_atomic(out_dir / "junit.xml", to_junit(report))
    render(report, console)
    return report


def _keep_previous(out_dir: Path) -> Path | None:
    """Move an earlier explain's folder (one with an explain.json) aside to
    ``explain-<its time>``, so that a new explain (which rewrites explain.json from its first
    launch on) loses nothing; returns where it went, or None."""
    if not (out_dir / "explain.json").exists():
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S",
                          time.localtime((out_dir / "explain.json").stat().st_mtime))
    dest, n = out_dir.with_name(f"explain-{stamp}"), 1
    while dest.exists():
        n += 1
        dest = out_dir.with_name(f"explain-{stamp}-{n}")
    out_dir.rename(dest)
    return dest


def _stopped(exc: BaseException, report: "ExplainReport") -> str:
    """explain.json's ``status`` when explain ends early with ``exc``."""
    from .engine.session import Interrupted
    done = sum(1 for la in report.launches if la.get("command"))
    if isinstance(exc, Interrupted):
        return f"interrupted ({exc}) after {done} launch(es)"
    return f"stopped by an error after {done} launch(es): {str(exc)[:300]}"


class _Progress:
    """Writes explain.json and explain.md as explain goes (issue 33: a stopped explain keeps what
    it learned). Before the diagnosis is final, the cases are reported from their working
    state, with every configuration not reached yet ``{"skipped": "not tested yet"}`` in their
    controls and in the launches."""

    def __init__(self, report: "ExplainReport", cases: list[Case], out_dir: Path, run_dir: Path):
        self.report, self.cases, self.out_dir, self.run_dir = report, cases, out_dir, run_dir
        self.pending: list[Suspect | None] = []

    def save(self, status: str) -> None:
        """Rewrite explain.json and explain.md now, with ``status``."""
        from .render.explain import to_markdown
        rep = self.report
        rep.status = status
        shown = rep
        if not rep.cases:  # still launching: the working state, the rest not tested yet
            todo = [s for s in self.pending if s is not None]
            not_yet = {"skipped": "not tested yet"}
            cases = []
            for c in self.cases:
                path = self.out_dir / f"repro-{c.index}.toml"
                cr = CaseReport.of(c, rep.suspects, str(path.relative_to(self.run_dir))
                                   if path.exists() else "")
                cr.controls = {**c.results, **{s.name: dict(not_yet) for s in todo
                                               if s.name not in c.results}}
                cases.append(cr)
            seen = {la["config"] for la in rep.launches}
            launches = [*rep.launches, *({"config": _label(s), "skipped": "not tested yet"}
                                         for s in self.pending if _label(s) not in seen)]
            shown = replace(rep, cases=cases, launches=launches)
        write_atomic(self.out_dir / "explain.json", shown.to_json())
        write_atomic(self.out_dir / "explain.md", to_markdown(shown))


def _label(sus: Suspect | None) -> str:
    """A configuration's name in the launches and on the console."""
    return ("under test" if sus is None else sus.name if sus.combines else
            f"with {sus.change}" if sus.setting else f"without {sus.name}")


def _load_run(run: Path) -> tuple[Manifest, Path]:
    """The run's manifest and folder; UsageError for an unreadable manifest or a run the
    harness did not launch."""
    try:
        m = load_manifest(run)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    run_dir = Path(run) if Path(run).is_dir() else Path(run).parent
    if m.engine.get("mode") is None:
        raise UsageError(f"{run}: the run recorded no engine (status {m.status}: it ended "
                         "before its engine was up, or was killed then): nothing to explain")
    if m.engine.get("mode") != "launched" or not m.engine.get("launch"):
        raise UsageError(f"{run}: explain relaunches the engine, so the run must have been "
                         "launched by the harness (not attached with --url)")
    return m, run_dir


def _replay_all(session: EngineSession, target: Target, m: Manifest, cases: list[Case],
                report: ExplainReport, budget_s: float, t0: float, console: Console,
                progress: "_Progress", side: SideBySide,
                golden: _RunGolden | None = None) -> list[Suspect | None]:
    """Every configuration in turn (under test, the first round's suspects, then the second
    round's, :func:`follow_ups`), each on its own engine in ``session``, ``side.n`` engines
    started side by side (never across the two rounds); the cases that apply to it replayed
    there, one engine after another, the configuration under test first. A broader suspect
    whose narrower one already removed every case is skipped as implied
    (:func:`pleharness.explain_plan.implied_by`). Progress is saved after every launch.
    Returns the configurations (None: under test)."""
    suspects = list(report.suspects)
    configs: list[Suspect | None] = [None, *suspects]
    first_round = len(configs)
    n = 0
    second = False
    while True:
        if n >= len(configs):
            if second:
                break
            second = True  # the second round: 2x2 cells and numeric settings
            more = follow_ups(m, suspects, cases)
            report.suspects += more
            configs += more
            if more:
                console.print(f"second round: {len(more)} more launch(es): "
                              + ", ".join(s.name for s in more), highlight=False)
            if n >= len(configs):
                break
        end = first_round if n < first_round else len(configs)
        batch: list[tuple[int, Suspect | None]] = []
        while n < end and len(batch) < side.n:
            sus = configs[n]
            n += 1
            if sus is not None and not batch:  # decided on what the replays so far showed
                todo = [c for c in cases if _applies(sus, c, suspects)]
                if not todo:
                    continue
                imp = implied_by(sus, todo, suspects)
                if imp is not None:
                    why = f"implied: {imp.change} already removes it"
                    report.launches.append({"config": _label(sus), "skipped": why})
                    for c in todo:
                        c.results[sus.name] = {"skipped": why}
                    continue
            if time.monotonic() - t0 > budget_s:
                report.launches.append({"config": _label(sus), "skipped": "budget"})
                for c in cases:
                    if sus is not None and _applies(sus, c, suspects):
                        c.results[sus.name] = {"skipped": "budget"}
                continue
            batch.append((n, sus))
        if not batch:
            continue
        progress.pending = [sus for _, sus in batch] + configs[n:]  # until each is recorded
        _replay_batch(session, target, batch, len(configs), cases, suspects, m, report,
                      console, side, golden)
        if any(sus is None for _, sus in batch):  # the reproducers exist from then on
            for c in cases:
                write_repro(c, progress.out_dir / f"repro-{c.index}.toml", m.run_id)
        progress.pending = configs[n:]
        progress.save(f"launch {sum(1 for la in report.launches if 'config' in la)} of "
                      f"{len(configs)} done")
    progress.pending = []
    return configs


def _replay_batch(session: EngineSession, target: Target, batch: list[tuple[int, Suspect | None]],
                  total: int, cases: list[Case], suspects: list[Suspect], m: Manifest,
                  report: ExplainReport, console: Console, side: SideBySide,
                  golden: _RunGolden | None = None) -> None:
    """Start the engines of ``batch`` ((launch number, suspect)) side by side, then replay on
    each in order and stop it. A suspect's engine that fails to start is recorded (the launch
    and each case's result); the configuration under test failing raises EngineError."""
    for i, sus in batch:
        console.print(f"[{i}/{total}] launching the engine {escape(_label(sus))} ...",
                      highlight=False)

    def starter(i: int, sus: Suspect | None):
        spec = target.launch_spec() if sus is None else sus.variant.spec(target)
        if side.add:
            spec = replace(spec, engine_args=[*spec.engine_args, *side.add])
        return lambda: session.start(target, spec=spec, log_name=f"engine-{i - 1}", gather=False)

    started = run_side_by_side([starter(i, sus) for i, sus in batch], side.n)
    for (i, sus), eng in zip(batch, started):
        label = _label(sus)
        if isinstance(eng, BaseException):
            if sus is None or not isinstance(eng, EngineError):
                session.stop_all()
                raise eng
            report.launches.append({"config": label, "error": str(eng.args[0]),
                                    "root_cause": eng.root_cause})
            for c in cases:
                if _applies(sus, c, suspects):
                    c.results[sus.name] = {"error": str(eng.args[0])}
            continue
        try:
            todo = [c for c in cases if sus is None or _applies(sus, c, suspects)]
            rp = _Replayer.for_run(eng.client, m, report.include_warnings, golden)
            report.launches.append({"config": label, "command": redact_argv(eng.server.command),
                                    "ready_s": round(eng.server.ready_s or 0, 1)})
            for c in todo:
                if sus is None:
                    for name, level in c.levels.items():
                        res = rp.run(level, report.tries)
                        c.baseline[name] = res
                        if res["fails"]:
                            c.minimal = name
                            break
                else:
                    c.results[sus.name] = _replay_suspect(rp, sus, c, m, report.tries)
        finally:
            session.stop(eng)
