"""The TLS of ``streambandit api --tls-cert --tls-key``: TLS 1.2 and later, Python's default
ciphers for a server."""

from __future__ import annotations

import ssl

__all__ = ["server_context"]


def server_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """A server context of the PEM certificate chain ``cert`` and its private key ``key``; None
    when neither is given. ValueError (one line) when only one is, or when they do not load."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ValueError("--tls-cert and --tls-key go together: give both, or neither")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"--tls-cert {cert} --tls-key {key}: cannot load them as a PEM certificate chain and "
            f"its private key ({exc.strerror or exc})"
        ) from None
    return ctx
