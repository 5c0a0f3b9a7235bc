"""The ``dialect`` setting accepts exactly the dialects the proxy has: the config's list is
written out (reading a config must not import the parsers), so a dialect added to the
registry without it — or the other way round — is caught here."""

from __future__ import annotations

import pytest

from llmtop.config import DIALECT_SETTINGS, ConfigError, load_config
from llmtop.proxy.dialects.registry import DIALECTS


def test_the_config_accepts_the_registrys_dialects_and_no_others() -> None:
    assert list(DIALECT_SETTINGS) == list(DIALECTS)


@pytest.mark.parametrize("name", DIALECT_SETTINGS)
def test_each_dialect_setting_loads(name: str) -> None:
    assert load_config(None, env={}, overrides={"dialect": name}).dialect == name


def test_an_unknown_dialect_is_refused_with_the_list() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, env={}, overrides={"dialect": "vllm"})
    assert str(err.value) == ("dialect 'vllm' is not one of auto, openai, anthropic, ollama, "
                              "tgi, sglang, other")
