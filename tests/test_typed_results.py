"""Issue 34 item 4, typed all the way to the file: the manifest's tables, the reproducer
confirmation and explain's result are models whose JSON is the dicts they replaced (keys and
their order), and the files written before the change load to the same typed values."""
from __future__ import annotations

import glob
import json

from conftest import ROOT
from pleharness.manifest import RunOptionsRecord, load_manifest
from pleharness.manifest.explain import ExplainResult
from pleharness.manifest.tables import (Confirmation, FactConflictRow, NoteRow, ReplayRow,
                                        ReproducerRow)
from pleharness.scenarios.boundary import EdgeRow
from pleharness.scenarios.capture_edges import CaptureEdgeRow
from pleharness.scenarios.determinism import DeterminismRow
from pleharness.scenarios.fuzz.rows import (ExampleRow, FailingRow, FuzzSummaryRow,
                                            ShrinkStepRow)
from pleharness.scenarios.insert import InsertRow
from pleharness.scenarios.kv_pressure import KvPressureRow, KvPressureSkipRow
from pleharness.scenarios.replay import FailedComparisonRow

BEFORE = ROOT / "tests" / "data" / "manifest-before-issue34.json"  # a fuzz run (FakeEngine)
ROWS = {"fact_conflicts": FactConflictRow, "fact_sources": NoteRow,
        "reproducers": ReproducerRow, "fuzz_summary": FuzzSummaryRow,
        "fuzz_shrink_steps": ShrinkStepRow, "fuzz_examples": ExampleRow,
        "fuzz_failing": FailingRow, "insert": InsertRow, "capture_edges": CaptureEdgeRow,
        "determinism": DeterminismRow, "max_model_len_edges": EdgeRow,
        "replay_failed_comparisons": FailedComparisonRow}


def _same(model, row: dict) -> bool:
    """``row`` read through ``model`` and written again is the same JSON, key order included."""
    return json.dumps(model.model_validate(row).model_dump()) == json.dumps(row)


def test_a_manifest_written_before_the_change_loads_to_the_same_typed_values():
    data = json.loads(BEFORE.read_text())
    m = load_manifest(BEFORE, with_requests=False)
    for name in ("engine", "run_options", "summary"):  # same keys, same order
        assert json.dumps(getattr(m, name).model_dump()) == json.dumps(data[name]), name
    assert m.engine.mode == "attached" and m.run_options.near_tie_nats == 0.5
    assert m.summary.reproducers == data["summary"]["reproducers"]
    (row,) = ReproducerRow.rows(m, "reproducers")
    assert row.source == "fuzz" and row.fallback == "repro-larger.toml"
    assert isinstance(row.confirmation, Confirmation) and row.confirmation.rate == "0/1"
    assert row.confirmation.fresh_engine is False and row.verdict.startswith("0/1: not")
    (replay,) = row.confirmation.replays
    assert isinstance(replay, ReplayRow) and replay.exit_code == 0 and not replay.reproduced
    assert replay.engine_ready_s is None and "engine_ready_s" in replay.model_fields_set
    assert replay.failing is None and "failing" not in replay.model_dump()
    (s,) = FuzzSummaryRow.rows(m, "fuzz_summary")
    assert s.confirmed is False and s.reproduction_rate == "0/1" and s.space["q"] is not None
    assert [n.note for n in NoteRow.rows(m, "fact_sources")] == \
        [r["note"] for r in data["tables"]["fact_sources"]]
    assert [x.step for x in ShrinkStepRow.rows(m, "fuzz_shrink_steps")] == list(range(20))
    for key, model in ROWS.items():
        for r in data["tables"].get(key, []):
            assert _same(model, r), key


def test_every_table_of_the_recorded_gpu_runs_reads_and_writes_back_unchanged():
    """The tables of the runs kept in docs/gpu-runs (schema 1 and 2, 2026-11-29 on), read
    through their row models, are written back as they were; so are the three sections (as
    dicts: the oldest files ordered their keys otherwise) and a control run's ``role``."""
    files = sorted(glob.glob(str(ROOT / "docs" / "gpu-runs" / "**" / "*manifest.json"),
                             recursive=True))
    assert len(files) >= 10
    seen = set()
    for f in files:
        data = json.loads(open(f).read())
        m = load_manifest(f, with_requests=False)
        for name in ("engine", "run_options", "summary"):
            assert getattr(m, name).model_dump() == data.get(name, {}), (f, name)
        for key, rows in data.get("tables", {}).items():
            model = NoteRow if key.endswith("_notes") else ROWS.get(key)
            if key == "kv_pressure":
                model = KvPressureSkipRow if list(rows[0]) == ["result", "facts"] else KvPressureRow
            if model is None:
                continue
            seen.add(key)
            assert all(_same(model, r) for r in rows), (f, key)
    assert {"fact_conflicts", "fact_sources", "insert", "capture_edges", "determinism",
            "max_model_len_edges", "kv_pressure", "boundary_notes"} <= seen
    ctl = load_manifest(ROOT / "docs" / "gpu-runs" / "2026-11-30-g-random-ngram-control" /
                        "control-manifest.json", with_requests=False)
    assert ctl.run_options.role == "control run"


def test_a_confirmation_dumps_as_the_dict_it_replaced():
    """The shape of reproduce's module docstring: the result's keys in their order, a replay's
    optional keys only once set."""
    res = Confirmation(runs=3, reproduced=3, errors=0, inconclusive=0, fresh_engine=True,
                       rate="3/3", verdict="reproduced 3/3 on fresh engines", side_by_side=1,
                       replays=[ReplayRow(run=1, exit_code=1, reproduced=True, manifest="m")])
    res.replays[0].failing = ["r2-0 differs from its reference at token position 5"]
    assert res.model_dump() == {
        "runs": 3, "reproduced": 3, "errors": 0, "inconclusive": 0, "fresh_engine": True,
        "rate": "3/3", "verdict": "reproduced 3/3 on fresh engines", "side_by_side": 1,
        "replays": [{"run": 1, "exit_code": 1, "reproduced": True, "manifest": "m",
                     "failing": ["r2-0 differs from its reference at token position 5"]}]}
    shared = res.model_copy(update={"same_schedule_as": "explain/repro-1.toml"})  # explain
    assert list(shared.model_dump())[-1] == "same_schedule_as"
    row = ReproducerRow(source="fuzz", path="repro.toml", schedule="C1[3+6]",
                        summary_table="fuzz_summary")
    assert row.model_dump() == {"source": "fuzz", "path": "repro.toml", "schedule": "C1[3+6]",
                                "summary_table": "fuzz_summary"}
    row.confirmation, row.verdict = res, res.verdict
    assert list(row.model_dump()) == ["source", "path", "schedule", "summary_table",
                                      "confirmation", "verdict"]
    assert ReproducerRow.model_validate(json.loads(json.dumps(row.model_dump()))) == row


def test_explain_json_reads_and_writes_back_unchanged():
    """A recorded explain.json (GPU run q, with its reproductions) read as an ExplainResult is
    written back byte for byte (explain writes json.dumps(..., indent=1))."""
    path = ROOT / "docs" / "gpu-runs" / "2026-12-05-q-issue35-premerge-h100" / "ttd" / \
        "explain.json"
    text = path.read_text()
    res = ExplainResult.model_validate(json.loads(text))
    assert res.cases and isinstance(res.cases[0].reproduction, Confirmation)
    assert res.suspects[0].name and res.elapsed_s is not None
    assert json.dumps(res.model_dump(), indent=1) == text


def test_judging_options_read_the_typed_run_options():
    from pleharness.reproduce import judging_options
    assert judging_options(RunOptionsRecord(golden=None, near_tie_nats=1)) == {
        "golden": True, "near_tie_nats": 1.0, "strict": False, "reference_cache_state": "warm"}


def test_a_summary_row_that_takes_a_reproduction_declares_its_columns_in_order():
    """ReproductionColumns is what the confirmation writes into a kind's summary row: fuzz's row
    model declares every column with the same type, in the same order, so it loads the row back."""
    from pleharness.manifest.tables import ReproductionColumns
    cols = ReproductionColumns.model_fields
    fuzz = FuzzSummaryRow.model_fields
    assert all(fuzz[k].annotation == f.annotation for k, f in cols.items())
    assert [k for k in fuzz if k in cols] == list(cols)


def test_the_confirmation_writes_its_columns_into_any_kinds_summary_table():
    """A reproducer of another kind, naming its own summary table: the columns are written into
    that table's first row, its other columns kept as they were (no per-kind lookup)."""
    from pleharness import pipeline
    from pleharness.manifest import Manifest
    m = Manifest(run_id="t", tables={"other_summary": [{"found": 3, "confirmed": None}]})
    row = ReproducerRow(source="other", path="repro.toml", summary_table="other_summary",
                        verdict="2/3: reproduced")
    res = Confirmation(runs=3, reproduced=2, errors=0, inconclusive=0, fresh_engine=True,
                       rate="2/3", verdict="2/3", side_by_side=1, replays=[])
    pipeline._summary_reproduction(m, row, res, fresh=True)
    assert m.tables["other_summary"] == [{
        "found": 3, "confirmed": True, "reproduction": "2/3: reproduced",
        "reproduction_rate": "2/3", "larger_reproduction_rate": None,
        "confirmed_on_fresh_engine": True}]
    m.tables["other_summary"] = []  # an empty table: nothing written, nothing raised
    pipeline._summary_reproduction(m, row, res, fresh=True)
    assert m.tables["other_summary"] == []
