"""Engine telemetry: the upstream's Prometheus ``/metrics`` scraped and recognised
(vLLM, SGLang, TGI, llama.cpp server, llmtop's simulator, or unknown with raw values)."""

from llmtop.engines.quantile import buckets_delta, engine_ttft_quantile
from llmtop.engines.recognise import recognise
from llmtop.engines.scraper import EngineScraper, metrics_url_for, open_engine_scraper

__all__ = [
    "EngineScraper",
    "buckets_delta",
    "engine_ttft_quantile",
    "metrics_url_for",
    "open_engine_scraper",
    "recognise",
]
