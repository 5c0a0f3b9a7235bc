"""``llmtop sim``: a simulated continuous-batching inference engine behind an
OpenAI-compatible (and Anthropic, Ollama, TGI, SGLang) HTTP server, for demos and tests.

* :mod:`llmtop.sim.profiles` — :class:`~llmtop.sim.profiles.SimProfile`, ``PROFILES``,
  ``get_profile(name, **overrides)``;
* :mod:`llmtop.sim.engine` — the scheduler (admission, prefill, decode steps, KV cache,
  preemption) and its ground truth;
* :mod:`llmtop.sim.server` — ``make_sim_app(profile)``, ``running_sim(...)``;
* :mod:`llmtop.sim.faults` — the ``X-Sim-Fault`` header.

This package stands alone: of the rest of llmtop it imports only two helpers that import
nothing of llmtop's themselves, :mod:`llmtop.listen` (binding ``--listen``) and
:mod:`llmtop.stop_signals` (the signals that stop it), so that ``llmtop sim`` listens and
stops as ``llmtop run`` does (``tests/sim/test_sim_stands_alone.py``).
"""
