"""Scenario kind ``fuzz``: property-based schedules (hypothesis), shrunk to a one-file reproducer.

Hypothesis draws *schedules* from the engine facts and runs each one on the engine (one engine,
references cached across examples). A schedule is 1..``max_phases`` phases; a phase is a
concurrency c (1..min(max_num_seqs, ``max_concurrency``), weighted towards the edges: 1, 2,
capture sizes s and s + 1, the c where c * q crosses a capture size, max_num_seqs) and exactly c
requests issued together. Each request is

- ``new``: a prompt of a drawn length, mostly from the boundary set
  (:func:`~pleharness.scenarios.shared.lengths.boundary_lengths`: q, n*B + q, n*C + q, +-1, window edges,
  and the M edge ``M - max_tokens``), sometimes uniform in [1, M - max_tokens]; chat-shaped
  (``Reply with OK.`` padded with filler) where the length allows and the draw asks for it, else
  seeded random token IDs (:func:`~pleharness.prompts.seeded_prompts`, one of 4 seeds per length);
- ``warm``: a repeat of a prompt of an earlier phase (prefix-cached);
- ``copy``: an identical copy of an earlier request of the same phase, in flight with it;

with a ``max_tokens`` in 1..``max_tokens`` (every residue mod q when ``max_tokens`` >= q),
streamed or not (one JSON response; references are always streamed, and a non-streamed output
must equal its streamed reference), and, where the engine probe measured that seeded samples
reproduce alone and in a batch (:func:`~.strategy.sampling_allowed`; without a probe: where speculative
decoding is known to be off, ``num_speculative_tokens`` known and 0), sometimes a seeded sample
(``temperature``, one of 4 seeds; it must reproduce its solo sample, never excused as a near
tie). With ``features`` (default on), each request also gets, each with probability 1/8 and
shrunk towards absent, the per-request parameters of issue 35 that its engine configuration
takes (:mod:`pleharness.scenarios.fuzz_features`): ``logprobs`` (then ``logprob_parity``),
``stop_token_ids`` (the ID its request without parameters emits at a drawn position),
``min_tokens``, ``ignore_eos`` off, a penalty, ``logit_bias`` (speculative decoding known off),
``prompt_logprobs`` and ``echo`` (non-streamed), chat-API requests (shape ``messages``, a chat
template), a stop string (chat-shaped prompts) and constrained output (text prompts, where the
``constrained`` kind's probe passes); all but logprobs and the chat shape are in the reference
key.

One phase in three also gets a *carrier*: a streamed decode of up to ``carrier_tokens`` tokens
(a prompt with room for it), issued with the phase's requests, and 1..``max_inserts`` *inserts*,
each a drawn request sent once the carrier has streamed a drawn number of tokens (client-seen;
:mod:`pleharness.scenarios.shared.inserting`, shared with the ``insert`` kind), so its prefill shares
steps with the running decode. Carrier and inserts are compared with their references like any
request. An insert sent after the carrier ended is counted (``inserts_late``), not failed.

Property: every request of the example (its single-request references, warm by default, and its
phases) passes under the same verdict policy as ``stress``: a hard divergence from the reference,
a failed check (``health_after_phase`` included: the engine stays healthy) or a request error
fails; a near tie is a warning. An example fails when any phase it recorded has status ``fail``.

Budget: ``max_examples`` (hypothesis' valid examples), ``time_budget_s`` (no new example starts
after it; shrinking gets ``shrink_budget_s`` more). Hypothesis' example database is
``db`` (default ``<run>/hypothesis-db``), so a rerun with the same ``db`` replays stored failing
examples first. ``seed`` makes the search reproducible.

On failure hypothesis shrinks; the smallest failing schedule is written as ``<run>/repro.toml`` (a
``replay`` scenario: ``ple-harness stress --scenario repro.toml`` replays it) and replayed
again (``confirm``). After hypothesis' shrinker a greedy pass deletes phases, then requests, while
the schedule still fails (stages ``delete``, ``delete-retry``). Manifest tables:
``fuzz_examples`` (every example run: stage search / shrink / delete / delete-retry / confirm,
schedule summary, verdict, seconds),
``fuzz_shrink_steps`` (each failing example, in the order seen: the first found, then every
smaller one), ``fuzz_failing`` (the minimal schedule, request by request, with its role: request,
carrier or insert, an insert's ``insert_after_tokens``, its drawn ``features``, ``logprobs``,
``params`` as sent and ``api``) and ``fuzz_summary`` (one row: counts,
seconds per example, repro path). The confirming replay (stage ``recheck``) runs the minimal
schedule three times; when it does not fail every time (a timing-dependent fault shrunk to its
edge), the larger failing schedules seen are tried, newest first, and the first that fails every
time is the reproducer (``smallest_unconfirmed`` names the one that did not).

The package, one room each: :mod:`.strategy` (the parameters, the schedule types, the space and
the hypothesis strategy that draws schedules), :mod:`.example` (one schedule run on the engine),
:mod:`.runner` (the kind :class:`~.runner.Fuzz`, whose run is the search loop: search, shrink,
confirm, the way hypothesis' own runner works inside one test) and :mod:`.repro` (the
reproducer file). Importing the package registers the kind.
"""
from . import runner  # noqa: F401  (registers the kind "fuzz")
