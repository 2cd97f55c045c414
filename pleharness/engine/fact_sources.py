"""The sources of the engine facts: each reads one place where the engine's configuration shows and
returns its values as ``{fact: value}`` (None: the source does not say): the ``/metrics`` cache
config gauge, ``/server_info``, the engine log, the model's config.json, and the launch arguments
parsed from a command line.

How the sources are ranked, merged and their disagreements named is :mod:`.facts` (its module
docstring has the table of sources and ranks).
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .metrics import info_labels


def parse_engine_args(args: Sequence[str]) -> dict[str, str | bool]:
    """Map ``--flag value`` / ``--flag=value`` / bare ``--flag`` to {flag: value or True}.

    Later occurrences win, as in argparse.
    """
    out: dict[str, str | bool] = {}
    i = 0
    args = list(args)
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
                out[k] = v
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                out[a] = args[i + 1]
                i += 1
            else:
                out[a] = True
        i += 1
    return out


def flag_name(arg: str) -> str:
    """An engine argument's flag as vLLM's parser reads it: ``--speculative_config=...`` ->
    ``--speculative-config`` (vLLM's FlexibleArgumentParser turns ``_`` into ``-`` in long
    options); a value (no leading ``--``) is returned unchanged."""
    if not arg.startswith("--"):
        return arg
    return "--" + arg[2:].split("=", 1)[0].replace("_", "-")


def metrics_observations(text: str | None) -> dict[str, Any]:
    """Facts from ``vllm:cache_config_info`` labels in a /metrics text (empty when absent).

    Label -> fact: block_size, effective_attention_block_size, mamba_block_size,
    cache_hit_alignment_tokens, enable_prefix_caching -> prefix_caching, sliding_window,
    kv_cache_size_tokens, num_gpu_blocks, cache_dtype -> kv_cache_dtype.
    """
    labels = info_labels(text or "", "vllm:cache_config_info")
    if not labels:
        return {}
    out = {"block_size": labels.get("block_size"),
           "effective_attention_block_size": labels.get("effective_attention_block_size"),
           "mamba_block_size": labels.get("mamba_block_size"),
           "cache_hit_alignment_tokens": labels.get("cache_hit_alignment_tokens"),
           "prefix_caching": labels.get("enable_prefix_caching"),
           "sliding_window": labels.get("sliding_window"),
           "kv_cache_size_tokens": labels.get("kv_cache_size_tokens"),
           "num_gpu_blocks": labels.get("num_gpu_blocks"),
           "kv_cache_dtype": labels.get("cache_dtype")}
    if out["kv_cache_size_tokens"] is None and labels.get("num_gpu_blocks") and \
            labels.get("block_size"):
        try:
            out["kv_cache_size_tokens"] = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except ValueError:
            pass
    return out


def _dig(d: Any, *paths: str) -> Any:
    """The first of the dotted ``paths`` that exists in nested dicts ``d`` (None otherwise)."""
    for path in paths:
        cur = d
        for part in path.split("."):
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            else:
                cur = None
                break
        if cur is not None:
            return cur
    return None


def server_info_observations(info: dict | None) -> dict[str, Any]:
    """Facts from ``GET /server_info?config_format=json`` (``{"vllm_config": {...}}``).

    Paths tried (several names per fact, for vLLM versions that moved them):
    ``cache_config.block_size``, ``scheduler_config.max_num_batched_tokens``,
    ``speculative_config.num_speculative_tokens`` / ``num_spec_tokens``,
    ``compilation_config.cudagraph_mode`` / ``cudagraph_capture_sizes``,
    ``model_config.max_model_len`` / ``dtype``, ``parallel_config.tensor_parallel_size`` ...
    """
    if not isinstance(info, dict):
        return {}
    cfg = info.get("vllm_config", info)
    if isinstance(cfg, str):  # text format (str(VllmConfig)): the same fields as the log line
        return log_observations(" with config: " + cfg)
    spec = _dig(cfg, "speculative_config")
    out = {
        "block_size": _dig(cfg, "cache_config.block_size"),
        "effective_attention_block_size": _dig(cfg, "cache_config.effective_attention_block_size"),
        "mamba_block_size": _dig(cfg, "cache_config.mamba_block_size"),
        "cache_hit_alignment_tokens": _dig(cfg, "cache_config.cache_hit_alignment_tokens"),
        "prefix_caching": _dig(cfg, "cache_config.enable_prefix_caching"),
        "kv_cache_dtype": _dig(cfg, "cache_config.cache_dtype"),
        "kv_cache_size_tokens": _dig(cfg, "cache_config.kv_cache_size_tokens"),
        "num_gpu_blocks": _dig(cfg, "cache_config.num_gpu_blocks"),
        "sliding_window": _dig(cfg, "cache_config.sliding_window"),
        "max_num_batched_tokens": _dig(cfg, "scheduler_config.max_num_batched_tokens"),
        "max_num_seqs": _dig(cfg, "scheduler_config.max_num_seqs"),
        "max_model_len": _dig(cfg, "model_config.max_model_len", "scheduler_config.max_model_len"),
        "dtype": _dig(cfg, "model_config.dtype"),
        "enforce_eager": _dig(cfg, "model_config.enforce_eager"),
        "tensor_parallel_size": _dig(cfg, "parallel_config.tensor_parallel_size"),
        "cudagraph_mode": _dig(cfg, "compilation_config.cudagraph_mode"),
        "cudagraph_capture_sizes": _dig(cfg, "compilation_config.cudagraph_capture_sizes"),
        "vocab_size": _dig(cfg, "model_config.hf_text_config.vocab_size",
                           "model_config.hf_config.vocab_size"),
        "device_type": _dig(cfg, "device_config.device_type", "device_config.device"),
    }
    if isinstance(spec, dict):
        out["num_speculative_tokens"] = _dig(spec, "num_speculative_tokens", "num_spec_tokens")
        out["speculative_method"] = spec.get("method")
    elif "speculative_config" in cfg and spec is None:
        out["num_speculative_tokens"] = 0
        out["speculative_method"] = None
    return out


_INT = r"([\d,]+)"


def log_observations(text: str | None) -> dict[str, Any]:
    """Facts from an engine log (vLLM 0.26 GPU and 0.32 CPU formats).

    - the last ``... with config: ...`` line: ``speculative_config=SpeculativeConfig(method='ngram',
      ..., num_spec_tokens=3)`` or ``=None``, ``dtype=torch.bfloat16``, ``max_seq_len=N``,
      ``tensor_parallel_size=N``, ``enable_prefix_caching=True``, ``kv_cache_dtype=auto``,
      ``enforce_eager=False``, and in ``compilation_config={...}``: ``'cudagraph_mode':
      <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>``, ``'cudagraph_capture_sizes': [1, 2, 4]``;
    - ``max_num_batched_tokens=N`` anywhere (the chunked-prefill line), last one wins; else the
      largest of the config line's ``'compile_ranges_endpoints': [...]`` (vLLM sets its upper
      bound to max_num_batched_tokens; 0.26 and 0.32 print no other line with C by default);
    - ``KV cache size: N tokens`` (``GPU KV cache size: 262,144 tokens``).
    """
    if not text:
        return {}
    out: dict[str, Any] = {}
    cfg_lines = [ln for ln in text.splitlines() if " with config: " in ln]
    if cfg_lines:
        c = cfg_lines[-1]

        def grab(pat: str):
            m = re.search(pat, c)
            return m.group(1) if m else None
        spec = re.search(r"speculative_config=(None|\w*\((.*?)\))", c)
        if spec:
            if spec.group(1) == "None":
                out["num_speculative_tokens"], out["speculative_method"] = 0, None
            else:
                body = spec.group(2) or ""
                k = re.search(r"num_spec(?:ulative)?_tokens=(\d+)", body)
                meth = re.search(r"method=['\"]?([\w-]+)", body)
                out["num_speculative_tokens"] = int(k.group(1)) if k else None
                out["speculative_method"] = meth.group(1) if meth else None
        out["dtype"] = grab(r"(?<![\w.])dtype=([\w.]+)")
        out["kv_cache_dtype"] = grab(r"(?<![\w.])kv_cache_dtype=([\w.]+)")
        out["max_model_len"] = grab(r"(?<![\w.])max_seq_len=(\d+)")
        out["tensor_parallel_size"] = grab(r"(?<![\w.])tensor_parallel_size=(\d+)")
        out["prefix_caching"] = grab(r"(?<![\w.])enable_prefix_caching=(\w+)")
        out["enforce_eager"] = grab(r"(?<![\w.])enforce_eager=(\w+)")
        mode = grab(r"['\"]cudagraph_mode['\"]:\s*(<CUDAGraphMode\.\w+|['\"]?\w+)")
        out["cudagraph_mode"] = mode.strip("'\"<") if mode else None
        sizes = grab(r"['\"]cudagraph_capture_sizes['\"]:\s*\[([\d,\s]*)\]")
        if sizes is not None:
            out["cudagraph_capture_sizes"] = [int(x) for x in re.findall(r"\d+", sizes)]
        ends = grab(r"['\"]compile_ranges_endpoints['\"]:\s*\[([\d,\s]+)\]")
        if ends:
            # vLLM's VllmConfig._set_compile_ranges: "The upper bound of the compile ranges is
            # the max_num_batched_tokens" (other endpoints are only added below it)
            out["max_num_batched_tokens"] = max(int(x) for x in re.findall(r"\d+", ends))
    budgets = re.findall(r"max_num_batched_tokens[=:]\s*(\d+)", text)
    if budgets:  # a line that states it wins over the compile ranges
        out["max_num_batched_tokens"] = budgets[-1]
    kv = re.findall(r"KV cache size:\s*" + _INT + r"\s*tokens", text)
    if kv:
        out["kv_cache_size_tokens"] = kv[-1].replace(",", "")
    return out


def model_config_observations(model_path: str | None) -> tuple[dict[str, Any], str | None]:
    """Hints from ``MODEL/config.json`` (its ``text_config`` for multimodal models): vocab_size,
    max_position_embeddings (-> max_model_len), eos_token_id, torch_dtype / dtype, sliding windows
    (``sliding_window`` unless ``use_sliding_window`` is false; ``layer_types`` counted),
    ``attention_chunk_size``. Returns (facts, the file's path or None)."""
    if not model_path:
        return {}, None
    cfg = Path(model_path) / "config.json"
    if not cfg.is_file():
        return {}, None
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return {}, None
    top = data
    data = data.get("text_config", data) or data
    out: dict[str, Any] = {
        "vocab_size": data.get("vocab_size", top.get("vocab_size")),
        "max_model_len": data.get("max_position_embeddings"),
        "eos_token_id": data.get("eos_token_id", top.get("eos_token_id")),
        "dtype": data.get("torch_dtype") or data.get("dtype") or top.get("torch_dtype")
        or top.get("dtype"),
        "attention_chunk_size": data.get("attention_chunk_size"),
    }
    sw = data.get("sliding_window")
    if data.get("use_sliding_window") is False:
        sw = None
    lt = data.get("layer_types")
    if isinstance(lt, list) and lt:
        counts: dict[str, int] = {}
        for t in lt:
            counts[str(t)] = counts.get(str(t), 0) + 1
        out["layer_types"] = counts
        if sw and not any("sliding" in str(t) for t in lt):
            sw = None  # a window declared but no layer uses it
    out["sliding_window"] = sw if isinstance(sw, (int, list)) else None
    return out, str(cfg)


def fetch_server_info(client) -> tuple[dict | None, str]:
    """GET /server_info?config_format=json with the client's session; (JSON or None, note)."""
    try:
        r = client.session.get(client.base_url + "/server_info",
                               params={"config_format": "json"}, timeout=30)
    except Exception as exc:  # noqa: BLE001 - an optional source
        return None, f"/server_info not read: {exc.__class__.__name__}"
    if r.status_code != 200:
        return None, (f"/server_info answered {r.status_code} (served only with "
                      "VLLM_SERVER_DEV_MODE=1)")
    try:
        return r.json(), "/server_info?config_format=json read"
    except ValueError:
        return None, "/server_info did not answer JSON"


_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# the keys vLLM derives a model's length from, the smallest wins (vLLM 0.32,
# transformers_utils/model_arch_config_convertor.py derive_max_model_len_and_key)
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
               "model_max_length", "max_target_positions", "max_sequence_length",
               "max_seq_length", "seq_len")
# RoPE types whose factor is already in the declared length (vLLM 0.32 _get_and_verify_max_len)
ROPE_NOT_SCALING = ("su", "longrope", "llama3", "yarn", "deepseek_yarn",
                    "deepseek_llama_scaling")


def parse_token_count(value: str | bool | None) -> int | None:
    """A ``--max-model-len`` value as vLLM's parser reads it (``human_readable_int`` in
    vllm/engine/arg_utils.py): ``4096``, ``32k`` / ``1.5k`` (decimal suffixes k m g t, x 1000^n)
    or ``32K`` (binary suffixes K M G T, x 1024^n, whole numbers only); ``-1``, ``auto``, a
    decimal without a suffix or anything else vLLM refuses or auto-fits -> None."""
    if not isinstance(value, str):
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)([kmgtKMGT]?)\s*", value)
    if not m:
        return None
    num, suffix = m.group(1), m.group(2)
    if "." in num and suffix not in _DECIMAL:
        return None  # vLLM: int("1.5") fails; decimals are not allowed with binary suffixes
    n = float(num) * _DECIMAL.get(suffix, _BINARY.get(suffix, 1))
    return int(n) if n > 0 else None


def _rope_entries(cfg: dict) -> list[dict]:
    """The RoPE parameter sets of a config: ``rope_scaling`` or ``rope_parameters``, one dict or
    one per layer type."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, dict):
        return []
    if rope and all(isinstance(v, dict) for v in rope.values()):
        return list(rope.values())
    return [rope]


def model_position_limit(model_path: str | None) -> tuple[int, str] | None:
    """The longest context a model's ``config.json`` declares, as vLLM 0.32 derives it
    (``_get_and_verify_max_len`` in vllm/config/model.py): the smallest of the length keys
    (:data:`LENGTH_KEYS`; ``model_max_length`` wins when set), times the RoPE scaling ``factor``
    of a type not in :data:`ROPE_NOT_SCALING` (not for gemma3). The tokenizer's own
    ``model_max_length`` is not read. Returns (tokens, how it was derived) or None when the file
    is missing, unreadable or declares no length."""
    if not model_path:
        return None
    try:
        data = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    text = data.get("text_config")
    cfg = text if isinstance(text, dict) else data
    found = {k: cfg[k] for k in LENGTH_KEYS
             if isinstance(cfg.get(k), (int, float)) and not isinstance(cfg.get(k), bool)
             and cfg[k] > 0}
    if not found:
        return None
    key = "model_max_length" if "model_max_length" in found else min(found, key=found.get)
    limit, how = float(found[key]), f"{key} {found[key]:g}"
    if "gemma3" not in str(data.get("model_type", "")) + str(cfg.get("model_type", "")):
        factor = 1.0
        for rp in _rope_entries(cfg):
            kind = str(rp.get("rope_type") or rp.get("type") or "default")
            if kind not in ROPE_NOT_SCALING and isinstance(rp.get("factor"), (int, float)):
                factor = float(rp["factor"])
        if factor != 1.0:
            limit *= factor
            how += f" x RoPE factor {factor:g}"
    return int(limit), how


def long_len_allowed(env: dict[str, str] | None) -> bool:
    """Whether vLLM would serve past the model's length: ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is
    ``1`` or ``true`` (vllm/envs.py) in the launch's environment (the harness's own, then the
    launch's additions)."""
    v = {**os.environ, **(env or {})}.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0")
    return v.strip().lower() in ("1", "true")


def positions_warning(model_path: str | None, engine_args: Sequence[str],
                      env: dict[str, str] | None = None) -> str | None:
    """A warning when the launch's ``--max-model-len`` is beyond the model's declared length
    (:func:`model_position_limit`), else None (also when ``--hf-overrides`` may change the
    config). vLLM refuses such a launch unless :func:`long_len_allowed`; with it the positions
    past the limit are outside what the model was built for (GPU run w,
    docs/gpu-runs/2026-12-07-w-issue47/: a bf16 MoE model of 4096 positions served at 20480 died
    in both configurations with a device-side assert), so what the harness sees there is the
    model's limit, not the engine's defect."""
    args = {flag_name(k): v for k, v in parse_engine_args(engine_args).items()}
    if "--hf-overrides" in args:
        return None
    asked = parse_token_count(args.get("--max-model-len"))
    limit = model_position_limit(model_path)
    if asked is None or limit is None or asked <= limit[0]:
        return None
    then = ("VLLM_ALLOW_LONG_MAX_MODEL_LEN is set, so vLLM will start, but prompts past "
            f"{limit[0]} tokens run outside the model's positions (an engine that dies or answers "
            "wrongly there shows the model's limit, not a defect)" if long_len_allowed(env) else
            "vLLM refuses to start it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    return (f"warning: --max-model-len {asked} is beyond the model's {limit[1]} "
            f"({Path(model_path or '.') / 'config.json'}): {then}; lower --max-model-len, or "
            "serve a copy of the model whose config.json declares more positions")
