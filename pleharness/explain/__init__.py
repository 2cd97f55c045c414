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
:class:`ExplainReport` (``explain.json`` is its :meth:`ExplainReport.result`, a
:class:`~pleharness.manifest.explain.ExplainResult` with its cases'
:class:`~pleharness.manifest.explain.CaseReport`); its console, Markdown and JUnit renderings
(of that result) are in :mod:`pleharness.render.explain`.

Every engine (the configuration under test, each suspect, the reproducers' fresh engines) runs in
one :class:`~pleharness.engine.session.EngineSession`: a suspect is a
:class:`~pleharness.engine.session.Variant` of the run's launch (the mechanism of ``stress``'s
control and reference engines); SIGINT / SIGTERM stop the engine and end explain with exit
130 / 143.

The job's rooms: :mod:`.suspects` (the suspects, the failing cases, the diagnosis),
:mod:`.replay` (the engines launched and the cases replayed on them), :mod:`.report` (the report,
the reproducers, explain.json as it goes) and :mod:`.job` (:func:`explain` and
:func:`confirm_repros`). This package's names are the job's API, gathered from those rooms.
"""
from .job import confirm_repros, explain
from .report import ExplainReport, write_repro
from .suspects import (Case, Suspect, failing_cases, follow_ups, narrow_down, numeric_variants,
                       rederive_length, resize_prompt, suspects_for, two_by_two)

__all__ = ["Case", "ExplainReport", "Suspect", "confirm_repros", "explain",
           "failing_cases", "follow_ups", "narrow_down", "numeric_variants", "rederive_length",
           "resize_prompt", "suspects_for", "two_by_two", "write_repro"]
