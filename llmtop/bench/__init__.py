"""`llmtop bench`: load generation and the search for the largest concurrency (or rate)
that still meets the SLOs. Measurements use the proxy's dialect parsers and produce the same
RequestRecord events, aggregated by the same metrics code as live traffic."""
