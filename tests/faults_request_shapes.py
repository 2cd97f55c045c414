"""Fault doubles of issue 52 (the request shapes the suite did not send before), for a
:class:`doubles.FaultProxy` in front of the real CPU engine: the selftest's family classes
(:mod:`pleharness.faults.families`), re-exported here.

- :class:`TruncationLostBesideGreedy`: a seeded top_k / top_p / min_p request that arrives
  while a greedy request is in flight is sent without its truncation.
- :class:`MinTokensLostUnderLoad`: a min_tokens request that arrives while another is in flight
  is sent without min_tokens (EOS, stop IDs, stop strings end it early).
- :class:`SpecialTextSkippedUnderLoad`: skip_special_tokens false is dropped under load (the
  text loses the special tokens it asked to keep).
"""
from pleharness.faults.families import (MinTokensLostUnderLoad,  # noqa: F401
                                        SpecialTextSkippedUnderLoad, TruncationLostBesideGreedy)
