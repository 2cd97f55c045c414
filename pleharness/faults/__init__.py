"""Fault injection in front of a real engine: :mod:`.proxy` (the forwarding proxy and the fault
classes the tests use) and :mod:`.builtin` (the planted fault classes of ``ple-harness
selftest``)."""
from .builtin import BUILTIN, SelftestFault
from .proxy import Fault, FaultProxy, RequestCtx

__all__ = ["BUILTIN", "Fault", "FaultProxy", "RequestCtx", "SelftestFault"]
