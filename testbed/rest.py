"""A tiny synchronous HTTPS client for bringing a test-bed cluster up.

Only the test bed uses it, before any product code runs: readiness probes and the creation of
fake nodes. Authentication is the admin client certificate the test bed made.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status


class RestClient:
    def __init__(self, server: str, ca: Path, cert: Path, key: Path) -> None:
        self.server = server.rstrip("/")
        self._ssl = ssl.create_default_context(cafile=str(ca))
        self._ssl.load_cert_chain(str(cert), str(key))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: float = 5.0,
        content_type: str = "application/json",
    ) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def json(self, method: str, path: str, body: Any = None) -> dict:
        status, raw = self.request(method, path, body)
        if status >= 300:
            raise ApiError(status, raw.decode(errors="replace"))
        return json.loads(raw)

    def get(self, path: str) -> dict:
        return self.json("GET", path)

    def create(self, path: str, body: dict) -> dict:
        return self.json("POST", path, body)
