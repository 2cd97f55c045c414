"""pleharness.divergence, function by function (issue 50's test mirror): where two outputs part,
how one divergence is settled from the evidence on it (the order of docs/references.md), one
comparison under a run's rule, and how often a replay must repeat an intermittent failure."""
import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pleharness import divergence as dv
from pleharness.attribution import attribute
from pleharness.envelope import apply as apply_envelope
from pleharness.manifest import (CheckResult, Divergence, Manifest, PhaseRecord, RequestRecord,
                                 RunOptionsRecord as RunOptions)
from pleharness.run.settlement import parity_status, record_settlement

ids = st.lists(st.integers(0, 50), max_size=20)


@given(ids, ids)
def test_first_divergence_is_where_the_lists_part(a, b):
    pos = dv.first_divergence(a, b)
    if a == b:
        assert pos is None
        return
    assert pos is not None and a[:pos] == b[:pos]
    assert pos == min(len(a), len(b)) or a[pos] != b[pos]


def test_reconverges_needs_the_same_length_and_the_same_tail():
    ref = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert dv.reconverges(ref, [1, 2, 99, 4, 5, 6, 7, 8, 9, 10], 2)
    assert not dv.reconverges(ref, [1, 2, 99, 4, 5, 6, 7, 8, 9, 11], 2)
    assert not dv.reconverges(ref, ref[:9], 2)  # shorter: never reconverged
    assert not dv.reconverges(ref, ref[:9] + [0], 9)  # parted at the last token


def test_margins_skip_sentinels_and_rank_by_value():
    tops = [{"5": -0.1, "7": -2.6}, {"7": -3.0, "5": -0.5}, {"1": -0.2, "2": -9999.0},
            {"1": -0.2, "2": float("-inf")}]
    assert dv.margins(tops) == [2.5, 2.5, None, None]
    assert dv.margins(None) is None


def test_near_tie_threshold_by_dtype_and_override():
    bf16, why = dv.near_tie_threshold("bf16")
    assert why == "serving dtype bfloat16" and bf16 > 0
    assert dv.near_tie_threshold("torch.float32")[0] <= bf16
    assert dv.near_tie_threshold("auto")[1].startswith("serving dtype 'auto' unknown")
    assert dv.near_tie_threshold("bfloat16", 0.25) == (0.25, "--near-tie-nats")


def div(**kw) -> Divergence:
    base = dict(position=3, reference_token=5, observed_token=7, threshold_nats=0.5,
                fails=True, **{"class": "hard"})
    return Divergence.model_validate({**base, **kw})


@pytest.mark.parametrize("kw, cls, fails, by", [
    (dict(margin_nats=0.1), "near_tie", False, "engine margin"),
    (dict(margin_nats=2.0), "hard", True, "engine margin"),
    (dict(margin_nats=0.1, observed_in_reference_top=False), "hard", True, "engine margin"),
    (dict(margin_nats=None), "unknown", True, "none"),
    # an informative golden model (float32: its gap against the threshold, both in its top-k)
    (dict(margin_nats=2.0, golden_gap_nats=0.1, reference_in_golden_top=True,
          observed_in_golden_top=True), "near_tie", False, "golden"),
    # an uninformative one decides nothing: the engine margin stands
    (dict(margin_nats=2.0, golden_gap_nats=0.1, reference_in_golden_top=True,
          observed_in_golden_top=True, golden_informative=False), "hard", True, "engine margin"),
    # the control reproduced it: a warning, whatever the margin
    (dict(margin_nats=2.0, attribution="also_in_control"), "hard", False, "control"),
    # both runs alone on an engine that repeats alone: hard, whatever came before
    (dict(margin_nats=0.1, attribution="also_in_control", solo_repeat="r1 vs r2"), "hard", True,
     "solo repeatability"),
    (dict(margin_nats=0.1, checks_failed=["degeneration"]), "near_tie", True,
     "engine margin; checks degeneration"),
    # the differential: the control's own solo runs disagree there: numerics, a near tie
    (dict(margin_nats=5.0, control_split="the control's own solo runs disagree at 2"),
     "near_tie", False, "the control's own solo runs disagree at 2"),
    (dict(margin_nats=5.0, control_split="own", solo_repeat="r1 vs r2"), "hard", True,
     "solo repeatability"),
])
def test_settle_follows_the_stated_order(kw, cls, fails, by):
    d = dv.settle(div(**kw))
    assert (d.cls, d.fails) == (cls, fails)
    assert d.decided_by.startswith(by)


def test_settle_strict_and_seeded_fail_a_near_tie():
    for kw in (dict(strict=True), dict(seeded=True)):
        d = dv.settle(div(margin_nats=0.1), **kw)
        assert d.cls == "near_tie" and d.fails and ";" in d.decided_by


def test_settle_control_on_half_precision_turns_a_golden_hard_into_a_near_tie():
    d = dv.settle(div(margin_nats=2.0, golden_gap_nats=3.0, reference_in_golden_top=True,
                      observed_in_golden_top=True, attribution="also_in_control"),
                  half_precision=True)
    assert d.cls == "near_tie" and not d.fails and d.reclassified


@pytest.mark.parametrize("margin, strict, temperature, fails", [
    (0.1, False, 0.0, False), (3.0, False, 0.0, True), (0.1, True, 0.0, True),
    (0.1, False, 0.8, True)])
def test_compare_outputs_under_a_rule(margin, strict, temperature, fails):
    ref, obs = [1, 2, 3, 4], [1, 2, 9, 4]
    rule = dv.Rule(near_tie_nats=0.5, strict=strict, serving_dtype="float32")
    assert dv.compare_outputs(ref, ref, rule, [margin] * 4) is None
    d = dv.compare_outputs(ref, obs, rule, [margin] * 4, temperature=temperature)
    assert d is not None and d.position == 2 and d.fails is fails


# -- one entry point, one rule (issue 50 item 3) --------------------------------------------------

PACKAGE = Path(dv.__file__).resolve().parent


def calls_of(name: str) -> list[str]:
    """'module.py:line in function' for every call of ``name`` (a plain name or an attribute) in
    the package, found by the AST (a docstring or comment that names it is no call)."""
    out = []

    def visit(node: ast.AST, where: str, path: Path) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            where = node.name
        if isinstance(node, ast.Call) and name in (getattr(node.func, "id", None),
                                                   getattr(node.func, "attr", None)):
            out.append(f"{path.relative_to(PACKAGE)}:{node.lineno} in {where}")
        for child in ast.iter_child_nodes(node):
            visit(child, where, path)

    for path in sorted(PACKAGE.rglob("*.py")):
        visit(ast.parse(path.read_text(), str(path)), "<module>", path)
    return out


def test_settle_is_called_from_one_place():
    """Every divergence of the package is settled through ``settle_under`` (the run's Rule and the
    request's temperature): :func:`settle` itself has exactly one call site."""
    sites = calls_of("settle")
    assert len(sites) == 1, sites
    assert sites[0].startswith("divergence.py:") and sites[0].endswith(" in settle_under")


def test_no_module_rebuilds_the_flags_of_settle():
    """No module passes settle's flags (strict / seeded / half_precision) itself: they come from a
    Rule (:meth:`Rule.of_run` of a manifest, or the live run's) through ``settle_under``."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and "half_precision" in {k.arg for k in node.keywords}:
                assert path.name == "divergence.py", f"{path}:{node.lineno}"


@given(st.floats(0.0, 5.0, allow_nan=False), st.booleans(), st.booleans(),
       st.sampled_from([None, "bfloat16", "float32"]), st.sampled_from([0.0, 0.7]),
       st.sampled_from([None, "also_in_control", "only_under_test"]),
       st.one_of(st.none(), st.floats(0.0, 5.0, allow_nan=False)), st.booleans())
def test_settle_under_is_settle_with_the_rules_inputs(margin, strict, failed, dtype, temp,
                                                      attribution, gap, in_top):
    kw = dict(margin_nats=margin, attribution=attribution,
              checks_failed=["degeneration"] if failed else [])
    if gap is not None:
        kw.update(golden_gap_nats=gap, reference_in_golden_top=in_top,
                  observed_in_golden_top=True)
    a = dv.settle_under(div(**kw), dv.Rule(strict=strict, serving_dtype=dtype), temp)
    b = dv.settle(div(**kw), strict=strict, seeded=temp > 0,
                  half_precision=dtype == "bfloat16")
    assert a.model_dump() == b.model_dump()


def test_rule_of_run_reads_what_the_run_recorded():
    ro = RunOptions(near_tie_nats=0.25, strict=True, serving_dtype="float16")
    assert dv.Rule.of_run(ro) == dv.Rule(0.25, True, "float16")
    assert dv.Rule.of_run(RunOptions()) == dv.Rule()


def parity_disagreements(m: Manifest) -> list[str]:
    """Records whose parity check says otherwise than their settled divergence."""
    return [f"{r.id}: {ch.status} vs fails={r.divergence.fails}" for r in m.requests
            if r.divergence is not None and r.match is False
            for ch in r.checks if ch.name == "parity" and ch.status != parity_status(r.divergence)]


def record(i: int, out: str, match: bool, margin: float | None = None, temperature=0.0,
           status="fail") -> RequestRecord:
    r = RequestRecord(id=f"r{i}", scenario="s", phase="C4", concurrency=4, prompt_key="p",
                      prompt_len=3, prompt_hash=f"p{i % 3}", max_tokens=8, output_hash=out,
                      match=match, temperature=temperature)
    if not match:
        r.first_divergence = 3
        r.divergence = div(margin_nats=margin)
        r.checks.append(CheckResult(name="parity", status=status, detail="as judged"))
    return r


@given(st.lists(st.tuples(st.one_of(st.none(), st.floats(0.0, 3.0, allow_nan=False)),
                          st.sampled_from([0.0, 0.7]), st.booleans(), st.booleans()),
                min_size=1, max_size=6),
       st.booleans(), st.sampled_from([None, "bfloat16", "float32"]))
def test_the_parity_check_says_what_the_settled_divergence_says(rows, strict, dtype):
    """After every pass that adds evidence (control attribution, the numerics envelope), each
    diverging record's parity status is what its settled divergence says, whatever it was
    before."""
    main = Manifest(run_id="m", phases=[PhaseRecord(index=0, name="C4", scenario="s",
                                                    concurrency=4)])
    main.run_options = RunOptions(strict=strict, serving_dtype=dtype, near_tie_nats=0.5)
    main.requests = [record(i, f"bad{i}", False, m, t, "fail" if s else "warn")
                     for i, (m, t, s, _) in enumerate(rows)]
    ctl = Manifest(run_id="c")
    ctl.requests = [record(i, f"bad{i}" if same else "ok", not same)
                    for i, (_, _, _, same) in enumerate(rows)]
    attribute(main, ctl)
    assert parity_disagreements(main) == []
    apply_envelope(main, ctl)
    assert parity_disagreements(main) == []
    for r in main.requests:  # and a later settlement agrees with the one recorded
        before = r.divergence.model_dump()
        assert not record_settlement(r, dv.Rule.of_run(main.run_options))
        assert r.divergence.model_dump() == before
