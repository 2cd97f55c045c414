"""explain's planning room: the suspects (which engine features to switch off, their relations,
the second round's 2x2 cells and numeric variants), the failing cases of a run, and the diagnosis
of a case from its replays (:func:`narrow_down`). Nothing here starts an engine."""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..intermittent import intermittent_rate, replay_repeats
from ..engine.session import Variant
from ..errors import UsageError
from ..manifest import Manifest
from ..scenarios.shared.lengths import boundary_lengths


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
    rate: float = 0.0  # the failure's measured rate over the run's alike runs (0: constant)
    repeat: int = 1  # runs of the level one replay needs to show it with 95 % at that rate
    # a differential case (issue 47): the control's answer to the request alone, {"run",
    # "output_ids", "margins"}; each configuration's answer is judged against it, not against
    # its own solo reference (a defect that corrupts every run alike never differs from that)
    expected: dict[str, Any] | None = None

    def attribution(self, suspects: Sequence[Suspect] | None = None) -> str:
        """The diagnosis in one line, as a maintainer would write it in a PR (see
        :func:`narrow_down`); ``suspects`` give the relations (default: each result its own
        feature)."""
        if self.minimal is None:
            return "not reproduced on the configuration under test"
        if suspects is None:
            suspects = [Suspect(n, "") for n in self.results]
        return narrow_down(self, suspects)["summary"]


def manifest_facts(m: Manifest) -> dict[str, Any]:
    """The run's engine facts, as its manifest recorded them."""
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
    """The suspects worth switching off for this run (:mod:`pleharness.explain`), from its facts
    (``auto``), then one per ``extra`` engine argument (appended) and one per ``drops`` flag
    (removed with its value). Related suspects say so: FULL CUDA graphs (PIECEWISE) is
    ``within`` CUDA graphs (``--enforce-eager``)."""
    f = manifest_facts(m)
    args = list((m.engine.launch or {}).get("engine_args") or [])
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
    f = manifest_facts(m)
    args = list((m.engine.launch or {}).get("engine_args") or [])
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
        rate = intermittent_rate(_alike_outputs(m, r0))
        cases.append(Case(i, ph, conc, r0.phase, [q.id for q in recs], r0.first_divergence,
                          levels, prompt_len=len(m.prompts[ph]), rate=rate,
                          repeat=replay_repeats(rate)))
    for r in m.requests:  # the control answered this solo request differently
        d = r.differential
        if d is None or not (include_warnings or d.fails) or not r.control_answer:
            continue
        if r.prompt_hash not in m.prompts:
            raise UsageError(f"{m.run_id}: the manifest keeps no prompt IDs for "
                             f"{r.prompt_key}; rerun with this version of ple-harness to "
                             "explain it")
        cases.append(Case(len(cases) + 1, r.prompt_hash, 1, r.phase, [r.id], d.position,
                          {"alone": (1, [(m.prompts[r.prompt_hash], r.max_tokens)])},
                          prompt_len=len(m.prompts[r.prompt_hash]),
                          expected=dict(r.control_answer)))
    return cases


def _alike_outputs(m: Manifest, r0) -> list[str]:
    """The output hashes of every run of ``r0``'s request that ran alike (the same prompt,
    max_tokens and parameters, greedy, at its concurrency; alone: the solo references too), and
    its reference's: the failure's measured rate (issue 47 item 5)."""
    outs = [q.output_hash for q in m.requests
            if q.prompt_hash == r0.prompt_hash and q.max_tokens == r0.max_tokens
            and q.params == r0.params and not q.temperature and q.error is None
            and q.output_hash and q.concurrency == r0.concurrency]
    return outs + ([r0.reference_hash] if r0.reference_hash and r0.concurrency > 1 else [])


def suspect_label(sus: Suspect | None) -> str:
    """A configuration's name in the launches and on the console."""
    return ("under test" if sus is None else sus.name if sus.combines else
            f"with {sus.change}" if sus.setting else f"without {sus.name}")
