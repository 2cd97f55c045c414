"""Scraping the engine's Prometheus /metrics (parsed with prometheus_client's text parser).

Counter names (vLLM V1): ``vllm:prefix_cache_queries_total``, ``vllm:prefix_cache_hits_total``
(tokens), ``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_accepted_tokens_total``,
``vllm:num_preemptions_total`` (requests preempted, their KV blocks freed and recomputed later).
Info gauges (value 1, the information in the labels): ``vllm:cache_config_info``.
"""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

PREFIX_HITS = "vllm:prefix_cache_hits"
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREEMPTIONS = "vllm:num_preemptions"


def samples_named(text: str, keep) -> str:
    """``text`` with only the sample lines whose metric name ``keep(name)`` accepts (comment
    lines kept): vLLM's /metrics is mostly histogram buckets, which no reader here needs, and
    prometheus_client's parser spends its time on their labels (the harness scrapes before and
    after every phase, beside the engine under test)."""
    out = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            out.append(line)
            continue
        end = len(line)
        for ch in "{ ":
            i = line.find(ch)
            if i != -1:
                end = min(end, i)
        if keep(line[:end]):
            out.append(line)
    return "\n".join(out) + "\n"


def is_total(name: str) -> bool:
    """True for a counter sample name (``*_total``)."""
    return name.endswith("_total")


def info_labels(text: str, name: str) -> dict[str, str]:
    """Labels of the first sample of the info-style gauge ``name`` (e.g.
    ``vllm:cache_config_info``), without ``engine``; {} when absent or unparsable."""
    try:
        for fam in text_string_to_metric_families(samples_named(text, name.__eq__)):
            for s in fam.samples:
                if s.name == name:
                    return {k: v for k, v in s.labels.items() if k != "engine"}
    except ValueError:
        return {}
    return {}


def parse_counters(text: str) -> dict[str, float]:
    """Sum of every ``*_total`` sample per metric name (labels summed), keyed without ``_total``."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(samples_named(text, is_total)):
        for s in fam.samples:
            if s.name.endswith("_total"):
                key = s.name[: -len("_total")]
                out[key] = out.get(key, 0.0) + float(s.value)
    return out


def scrape(client) -> dict[str, float] | None:
    """Counters from ``client.metrics_text()``, or None when /metrics is not available."""
    text = client.metrics_text()
    if text is None:
        return None
    try:
        return parse_counters(text)
    except ValueError:
        return None


def delta(before: dict[str, float] | None, after: dict[str, float] | None, name: str) -> float | None:
    """after[name] - before[name]; None when either scrape or the counter is missing."""
    if before is None or after is None or name not in after:
        return None
    return after[name] - before.get(name, 0.0)


SPEC_DRAFTS = "vllm:spec_decode_num_drafts"  # verify steps that carried a draft
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"  # draft tokens proposed
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"  # draft tokens accepted
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"  # label ``position``


def snapshot(client) -> dict[str, float] | None:
    """:func:`scrape` plus the per-position accepted-token counters, keyed
    ``vllm:spec_decode_num_accepted_tokens_per_pos[<position>]``; None without /metrics."""
    text = client.metrics_text()
    if text is None:
        return None
    try:
        text = samples_named(text, is_total)
        out = parse_counters(text)
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == SPEC_ACCEPTED_PER_POS + "_total" and "position" in s.labels:
                    key = f"{SPEC_ACCEPTED_PER_POS}[{s.labels['position']}]"
                    out[key] = out.get(key, 0.0) + float(s.value)
    except ValueError:
        return None
    return out


RUNNING = "vllm:num_requests_running"  # gauge: requests in the engine's running queue
WAITING = "vllm:num_requests_waiting"  # gauge: requests waiting to be scheduled
REQUEST_SUCCESS = "vllm:request_success"  # counter, label ``finished_reason``: stop|length|abort


def gauge(text: str | None, name: str) -> float | None:
    """Sum of the samples of gauge ``name`` (labels summed) in /metrics ``text``; None when
    absent or unparsable."""
    if not text:
        return None
    found, total = False, 0.0
    try:
        for fam in text_string_to_metric_families(samples_named(text, name.__eq__)):
            for s in fam.samples:
                if s.name == name:
                    found, total = True, total + float(s.value)
    except ValueError:
        return None
    return total if found else None


def by_label(text: str | None, name: str, label: str) -> dict[str, float]:
    """{label value: sum} of counter ``name`` (``name_total`` samples) per value of ``label``,
    e.g. ``by_label(t, REQUEST_SUCCESS, "finished_reason")`` -> {"stop": 3.0, "abort": 1.0}; {}
    when absent or unparsable."""
    out: dict[str, float] = {}
    if not text:
        return out
    try:
        for fam in text_string_to_metric_families(samples_named(text, (name + "_total").__eq__)):
            for s in fam.samples:
                if s.name == name + "_total" and label in s.labels:
                    v = s.labels[label]
                    out[v] = out.get(v, 0.0) + float(s.value)
    except ValueError:
        return {}
    return out
