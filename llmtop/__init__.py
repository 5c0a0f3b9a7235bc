"""llmtop: `top` for LLM serving traffic."""

__version__ = "0.1.0"
