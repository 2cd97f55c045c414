"""Fault double of issue 35 item 3 (constrained output): the selftest's family class
:class:`pleharness.faults.constrained.ConstrainedBrokenUnderLoad` (a constrained request in
flight with another gets its first token changed and its text's first character replaced by
``#``: it no longer parses or matches), re-exported here."""
from pleharness.faults.constrained import ConstrainedBrokenUnderLoad, is_constrained  # noqa: F401
