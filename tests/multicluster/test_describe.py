"""Reasons a server did not answer read as words in conditions and logs, not as reprs."""

from __future__ import annotations

import ssl

import aiohttp
import pytest

from multicluster.client import describe


class Key:
    host, port, ssl = "10.0.0.9", 6443, True


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            aiohttp.ClientConnectorError(Key(), ConnectionRefusedError(111, "Connection refused")),
            "cannot connect to 10.0.0.9:6443: Connection refused",
        ),
        (
            aiohttp.ClientConnectorCertificateError(
                Key(), ssl.SSLCertVerificationError("certificate verify failed")
            ),
            "the server's TLS certificate is not trusted: certificate verify failed",
        ),
        (aiohttp.ServerDisconnectedError(), "the server closed the connection"),
        (TimeoutError(), "no answer in time"),
        (OSError("Network is unreachable"), "Network is unreachable"),
    ],
)
def test_why_a_server_did_not_answer(error, message):
    assert describe(error) == message
    assert "ConnectionKey" not in describe(error)
