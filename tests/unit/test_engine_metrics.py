"""pleharness.engine.metrics: the readers of vLLM's /metrics give the same values when they parse
only the samples they read (a histogram-heavy page, as vLLM serves it) as when prometheus_client
parses the whole page."""
from prometheus_client.parser import text_string_to_metric_families

from pleharness.engine import metrics

PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",enable_prefix_caching="True",engine="0"} 1.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 96.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 32.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 3.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 1.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 7.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 12.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
""" + "".join(f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{b}",model_name="m"}} 4.0\n'
              for b in ("0.001", "0.005", "0.01", "0.02", "0.04", "+Inf")) + """\
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.05
# HELP vllm:time_to_first_token_seconds_created created
# TYPE vllm:time_to_first_token_seconds_created gauge
vllm:time_to_first_token_seconds_created{engine="0",model_name="m"} 1.7e9
"""


def _whole_page_counters(text):
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_total"):
                out[s.name[:-6]] = out.get(s.name[:-6], 0.0) + s.value
    return out


class _Client:
    def metrics_text(self):
        return PAGE


def test_each_reader_gives_what_the_whole_page_gives():
    assert metrics.parse_counters(PAGE) == _whole_page_counters(PAGE)
    assert metrics.parse_counters(PAGE)[metrics.PREFIX_HITS] == 128.0
    assert metrics.gauge(PAGE, metrics.RUNNING) == 3.0
    assert metrics.gauge(PAGE, "vllm:no_such_gauge") is None
    assert metrics.by_label(PAGE, metrics.REQUEST_SUCCESS, "finished_reason") == {
        "stop": 3.0, "abort": 1.0, "length": 7.0}
    assert metrics.info_labels(PAGE, "vllm:cache_config_info") == {
        "block_size": "32", "enable_prefix_caching": "True"}
    snap = metrics.snapshot(_Client())
    assert snap[f"{metrics.SPEC_ACCEPTED_PER_POS}[0]"] == 40.0
    assert snap[f"{metrics.SPEC_ACCEPTED_PER_POS}[1]"] == 12.0
    assert snap[metrics.SPEC_ACCEPTED_PER_POS] == 52.0


def test_only_the_samples_read_are_parsed():
    kept = metrics.samples_named(PAGE, metrics.is_total)
    assert "_bucket" not in kept and "vllm:num_requests_running{" not in kept
    assert "vllm:prefix_cache_hits_total{engine=\"1\"" in kept
    assert kept.count("# TYPE") == PAGE.count("# TYPE")  # the comments stay
