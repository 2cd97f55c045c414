"""Engine doubles for issue 26 items 4 and 5 (client disconnects, prefix-cache isolation): faults a
healthy engine never produces, planted in front of the real engine by a FaultProxy: the selftest's family classes
(:mod:`pleharness.faults.families`), re-exported here."""
from __future__ import annotations

from pleharness.faults.families import CorruptAfterDisconnect, ServeFromOriginal  # noqa: F401
