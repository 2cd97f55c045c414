"""Fault doubles of issue 52 (the request shapes the suite did not send before), for a
:class:`doubles.FaultProxy` in front of the real CPU engine: the selftest's family classes
(:mod:`pleharness.faults.shapes`), re-exported here.

- :class:`TruncationLostBesideGreedy`: a seeded top_k / top_p / min_p request that arrives
  while a greedy request is in flight is sent without its truncation.
- :class:`MinTokensLostUnderLoad`: a min_tokens request that arrives while another is in flight
  is sent without min_tokens (EOS, stop IDs, stop strings end it early).
- :class:`SpecialTextSkippedUnderLoad`: skip_special_tokens false is dropped under load (the
  text loses the special tokens it asked to keep).
- :class:`AdapterOnBaseNeighbour`: a base-model request in flight beside a LoRA request gets
  the adapter's effect (its tokens changed from then on).
- :class:`StopMatchedPerDelta`: streamed stop strings matched in each delta's own text only: a
  stop that straddles two deltas is missed.
- :class:`ChoiceLogprobsSwapped`: choice 1 of a seeded request for n > 1 choices under load
  reports choice 0's logprobs.
"""
from pleharness.faults.shapes import (AdapterOnBaseNeighbour,  # noqa: F401
                                      ChoiceLogprobsSwapped, MinTokensLostUnderLoad,
                                      SpecialTextSkippedUnderLoad, StopMatchedPerDelta,
                                      TruncationLostBesideGreedy)
