"""A stand-in for the Hugging Face hub: the routes `huggingface_hub.snapshot_download` calls.

Point HF_ENDPOINT at it. It serves repos made of local directories: repo info, the file tree,
and `resolve` (HEAD for metadata, GET with Range for the bytes). A repo marked slow streams its
large files a few KB at a time on the first request, so a test can interrupt a pull half-way.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from aiohttp import web

CHUNK = 16 * 1024


class FakeHub:
    def __init__(self):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.slow: set[str] = set()
        self.served: set[tuple[str, str]] = set()
        self.requests: list[str] = []
        self.app = web.Application()
        self.app.add_routes([
            web.get("/api/models/{org}/{name}/revision/{rev}", self.info),
            web.get("/api/models/{org}/{name}/tree/{rev}", self.tree),
            web.get("/{org}/{name}/resolve/{rev}/{path:.+}", self.resolve),  # aiohttp answers HEAD too
        ])

    def add(self, repo_id: str, directory: Path, slow: bool = False) -> None:
        self.repos[repo_id] = {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}
        if slow:
            self.slow.add(repo_id)

    @staticmethod
    def sha(repo_id: str) -> str:
        return hashlib.sha1(repo_id.encode()).hexdigest()

    def _repo(self, request: web.Request) -> tuple[str, dict[str, bytes]]:
        repo_id = f"{request.match_info['org']}/{request.match_info['name']}"
        self.requests.append(f"{request.method} {request.path}")
        if repo_id not in self.repos:
            raise web.HTTPNotFound(headers={"X-Error-Code": "RepoNotFound"}, text='{"error": "Repository not found"}')
        return repo_id, self.repos[repo_id]

    async def info(self, request: web.Request) -> web.Response:
        repo_id, files = self._repo(request)
        return web.json_response({"id": repo_id, "sha": self.sha(repo_id), "siblings": [{"rfilename": f} for f in files]})

    async def tree(self, request: web.Request) -> web.Response:
        _, files = self._repo(request)
        entries = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()} for f, b in files.items()]
        return web.json_response(entries)

    async def resolve(self, request: web.Request) -> web.StreamResponse:
        repo_id, files = self._repo(request)
        data = files.get(request.match_info["path"])
        if data is None:
            raise web.HTTPNotFound(headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": self.sha(repo_id)})
        headers = {"X-Repo-Commit": self.sha(repo_id), "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
        start = int(request.headers.get("Range", "bytes=0-")[6:].split("-")[0] or 0)
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(len(data))})
        body = data[start:]
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        resp = web.StreamResponse(status=status, headers={**headers, "Content-Length": str(len(body))})
        await resp.prepare(request)
        key = (repo_id, request.match_info["path"])
        slow = repo_id in self.slow and key not in self.served and len(body) > 4 * CHUNK  # the first time only
        self.served.add(key)
        for i in range(0, len(body), CHUNK):
            await resp.write(body[i:i + CHUNK])
            if slow:
                await asyncio.sleep(0.05)
        return resp
