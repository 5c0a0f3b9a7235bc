"""TLS to an ``https://`` upstream: the system's trust store (``SSL_CERT_FILE`` and
``SSL_CERT_DIR`` are honoured), a CA file of the user's (``upstream_ca``: a private CA or a
self-signed certificate), or — for testing only — no verification (``upstream_verify =
false``). One context for the proxy's connections and for the scrapes of the upstream's
``/metrics``."""

from __future__ import annotations

import ssl

from llmtop.config import Config, ConfigError


def ssl_context(ca_file: str = "", verify: bool = True) -> ssl.SSLContext:
    """A client context trusting ``ca_file`` (PEM; empty: the system's store); ConfigError
    when the file cannot be read or holds no certificate."""
    try:
        ctx = ssl.create_default_context(cafile=ca_file or None)
    except FileNotFoundError:
        raise ConfigError(f"upstream_ca '{ca_file}': no such file") from None
    except (OSError, ssl.SSLError) as exc:
        why = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"upstream_ca '{ca_file}' is not a PEM file of CA certificates "
                          f"({why})") from None
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def upstream_ssl(cfg: Config) -> ssl.SSLContext | None:
    """The context for ``cfg``'s upstream; None when nothing differs from the defaults (so
    clients keep their own default context)."""
    if not cfg.upstream_ca and cfg.upstream_verify:
        return None
    return ssl_context(cfg.upstream_ca, cfg.upstream_verify)
