"""Fault double of issue 35 item 4 (prompt logprobs and echo): the selftest's family class
:class:`pleharness.faults.families.ShiftedPromptLogprobs` (scores shifted by one position under
load; ``relabel``: the IDs line up, only the values are the next position's), re-exported here."""
from pleharness.faults.scores import ShiftedPromptLogprobs, asks_scores  # noqa: F401
