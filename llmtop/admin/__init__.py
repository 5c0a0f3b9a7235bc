"""The admin API: snapshot, requests, recording control and ``/metrics`` (aiohttp)."""
