"""A stand-in for the Hugging Face Hub on 127.0.0.1: the endpoints ``huggingface_hub`` uses to list a model
repository's files (``/api/models/ORG/REPO[/revision/REV]`` with their sizes and LFS sha256) and to download
them (``/ORG/REPO/resolve/REV/FILE``, HEAD and GET with byte ranges), serving files from memory.

Faults, for the tests: ``cut`` names files whose first GET stops 64 KiB short and drops the connection;
``corrupt`` names files served with one byte flipped. ``requests`` logs (method, path, Range header).
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from typing_extensions import Self

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class StandInHub:
    def __init__(self, repos: dict[str, dict[str, bytes]]):
        self.repos = repos
        self.cut: set[str] = set()
        self.corrupt: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                hub._serve(self, body=True)

            def do_HEAD(self) -> None:
                hub._serve(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _info(self, repo: str) -> bytes:
        siblings = [
            {
                "rfilename": name,
                "size": len(data),
                "blobId": hashlib.sha1(data).hexdigest(),
                "lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134},
            }
            for name, data in self.repos[repo].items()
        ]
        return json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "siblings": siblings}).encode()

    def _serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        rng = h.headers.get("Range")
        self.requests.append((h.command, path, rng))
        parts = path.strip("/").split("/")
        if parts[:1] == ["api"] and len(parts) >= 4 and "/".join(parts[2:4]) in self.repos:
            return self._send(
                h, 200, self._info("/".join(parts[2:4])), {"Content-Type": "application/json"}, body
            )
        repo, name = "/".join(parts[:2]), "/".join(parts[4:])
        if parts[2:3] != ["resolve"] or repo not in self.repos or name not in self.repos[repo]:
            return self._send(h, 404, b"not found", {"X-Error-Code": "EntryNotFound"}, body)
        data = self.repos[repo][name]
        headers = {
            "X-Repo-Commit": COMMIT,
            "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if name in self.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = int(rng.removeprefix("bytes=").split("-")[0]) if rng else 0
        status = 206 if rng else 200
        if rng:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        payload = data[start:]
        if body and h.command == "GET" and name in self.cut:
            self.cut.discard(name)
            h.send_response(status)
            for k, v in {**headers, "Content-Length": str(len(payload))}.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(payload[: len(payload) - 65536])
            h.wfile.flush()
            h.close_connection = True
            return
        self._send(h, status, payload, headers, body)

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, payload: bytes, headers: dict, body: bool) -> None:
        h.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(payload))}.items():
            h.send_header(k, v)
        h.end_headers()
        if body:
            h.wfile.write(payload)
