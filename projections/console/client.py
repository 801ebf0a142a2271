"""The client side of ``gpuledger serve``: how ``sql`` and ``report`` find a running
console and ask it instead of opening the projection file it owns.

Only the standard library (``urllib``) is used, so the reading commands need none of the
server's dependencies.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["ServerError", "find_server", "get_json", "post_json"]

DISCOVERY_SUFFIX = ".console.json"  # the same as projections.console.app.DISCOVERY_SUFFIX


class ServerError(RuntimeError):
    """The console could not be reached, or answered with an error (its message)."""


def _request(url: str, token: str | None, data: bytes | None = None) -> Any:
    headers = {"Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if not url.startswith(("http://", "https://")):
        raise ServerError(f"--server {url!r}: expected an http:// or https:// URL")
    request = urllib.request.Request(url, data=data, headers=headers)  # noqa: S310  # checked above
    try:
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310  # as above
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            message = exc.reason
        raise ServerError(str(message)) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise ServerError(f"cannot reach the console at {url}: {exc}") from exc


def get_json(server: str, path: str, token: str | None, **params: Any) -> Any:
    """GET ``server + path`` with query ``params`` (``None`` values left out)."""
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    return _request(server.rstrip("/") + path + (f"?{query}" if query else ""), token)


def post_json(server: str, path: str, token: str | None, body: Any) -> Any:
    return _request(server.rstrip("/") + path, token, json.dumps(body).encode())


def find_server(db_path: str | os.PathLike[str], token: str | None) -> str | None:
    """The URL of a ``gpuledger serve`` that owns ``db_path`` and answers, else ``None``.

    ``serve`` writes ``<db>.console.json`` while it runs; a stale file (the process is
    gone, or it does not answer) is ignored, so the caller opens the file as usual.
    """
    announce = Path(f"{db_path}{DISCOVERY_SUFFIX}")
    try:
        info = json.loads(announce.read_text())
        url, pid = str(info["url"]), int(info["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # another user's process: it exists
    try:
        get_json(url, "/api/status", token)
    except ServerError:
        return None
    return url
