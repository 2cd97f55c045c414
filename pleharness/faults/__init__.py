"""Fault injection in front of a real engine: :mod:`.proxy` (the forwarding proxy), :mod:`.rules`
(the fault hooks and the fault classes the tests use), :mod:`.builtin` (the core planted fault
classes of ``ple-harness selftest``), :mod:`.families`, :mod:`.constrained`, :mod:`.scores` and
:mod:`.shapes` (one planted class per request-feature family).
:data:`BUILTIN`: every selftest class by name, the core ones first."""
from .builtin import CORE, SelftestFault
from .constrained import CONSTRAINED
from .families import FAMILIES as _REQUEST_FAMILIES
from .families import FamilyFault
from .proxy import FaultProxy
from .rules import Fault, RequestCtx
from .scores import SCORES
from .shapes import SHAPES

FAMILIES: dict[str, type[FamilyFault]] = {**_REQUEST_FAMILIES, **CONSTRAINED, **SCORES, **SHAPES}
BUILTIN: dict[str, type[SelftestFault]] = {**CORE, **FAMILIES}

__all__ = ["BUILTIN", "CORE", "FAMILIES", "Fault", "FamilyFault", "FaultProxy", "RequestCtx",
           "SelftestFault"]
