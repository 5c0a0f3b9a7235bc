"""`llmtop demo`: the simulated engine, the proxy with recording, ramping traffic and the TUI."""
