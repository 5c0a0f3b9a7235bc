"""The streaming reverse proxy: relay (read → timestamp → write → hand off) and dialects."""
