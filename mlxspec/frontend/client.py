"""A small HTTP client for the daemon (stdlib only): JSON requests and streamed NDJSON.

The daemon's address comes from MLXSPEC_HOST (default 127.0.0.1:11435; a scheme and a port are
optional, as with OLLAMA_HOST); MLXSPEC_API_KEY, when set, is sent as a bearer token.
"""

from __future__ import annotations

import http
import http.client
import json
import os
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

from ..errors import MlxspecError
from ..home import LOCAL_KEY_HEADER, read_local_key

from ..address import LOOPBACK, parse_host


class DaemonUnreachable(MlxspecError):
    """No daemon answers at the configured address."""


class ApiError(MlxspecError):
    """The daemon refused a request: its `{"error": ...}` message and the HTTP status."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class StreamCutOff(MlxspecError):
    """A streamed answer that ended before its final object: the daemon died or the connection broke."""


class UnexpectedReply(MlxspecError):
    """A 2xx reply of a shape no mlxspec daemon sends (not JSON, a field missing or of another type):
    most likely another server listens on the port."""


class Client:
    def __init__(self, host: str | None = None, api_key: str | None = None, timeout: float | None = None):
        self.scheme, self.host, self.port = parse_host(host)
        self.api_key = api_key if api_key is not None else os.environ.get("MLXSPEC_API_KEY")
        self.timeout = timeout  # None: wait as long as a generation takes

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def is_local(self) -> bool:
        """The daemon runs on this machine (a loopback address): it can read the paths we name."""
        return self.host in LOOPBACK

    def _connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout if timeout is not None else self.timeout)

    def _headers(self, path: str, content_type: str = "application/json") -> dict:
        headers = {"Content-Type": content_type}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        # Proof of being this machine's user, for local paths in create: never sent elsewhere.
        local_key = read_local_key() if path == "/api/create" and self.is_local else None
        if local_key:
            headers[LOCAL_KEY_HEADER] = local_key
        return headers

    def _send(self, method: str, path: str, body: Any = None, timeout: float | None = None):
        conn = self._connection(timeout)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body), headers=self._headers(path))
            resp = conn.getresponse()
        except (ConnectionRefusedError, OSError) as e:
            conn.close()
            raise DaemonUnreachable(f"no mlxspec daemon answers at {self.url} ({e.strerror or e}); start one with `mlxspec serve`") from None
        if resp.status >= 400:
            raise ApiError(_error_text(resp.read(), resp.status), resp.status)
        return conn, resp

    # -- blobs (Ollama's upload API) ---------------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        """HEAD /api/blobs/{digest}: whether the daemon holds a file of that sha256 already."""
        try:
            conn, _ = self._send("HEAD", f"/api/blobs/{digest}")
        except ApiError as e:
            if e.status == 404:
                return False
            raise ApiError(_head_error(self.url, e.status), e.status) from None
        conn.close()
        return True

    def upload_blob(self, digest: str, chunks: Iterable[bytes], size: int) -> None:
        """POST /api/blobs/{digest} with `size` bytes streamed from `chunks` (never held whole)."""
        conn, path = self._connection(), f"/api/blobs/{digest}"
        headers = {**self._headers(path, "application/octet-stream"), "Content-Length": str(size)}
        try:
            try:
                conn.request("POST", path, body=chunks, headers=headers)
            except OSError as e:  # the daemon answered early and closed: its answer says why
                resp = _early_answer(conn)
                if resp is None:
                    raise DaemonUnreachable(f"the connection to the daemon at {self.url} was lost while uploading "
                                            f"({e.strerror or e})") from None
            else:
                resp = conn.getresponse()
            data = resp.read()
            if resp.status >= 400:
                raise ApiError(_error_text(data, resp.status), resp.status)
        except (http.client.HTTPException, ConnectionError) as e:
            raise DaemonUnreachable(f"the connection to the daemon at {self.url} was lost while uploading "
                                    f"({type(e).__name__})") from None
        finally:
            conn.close()

    def request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        """One JSON answer (or text, or None for an empty body)."""
        conn, resp = self._send(method, path, body, timeout)
        try:
            data = b"".join(_lines(resp, self.url))
        finally:
            conn.close()
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return data.decode(errors="replace")

    def json_object(self, method: str, path: str, body: Any = None) -> dict:
        """`request` for the routes that answer a JSON object; anything else is an UnexpectedReply."""
        reply = self.request(method, path, body)
        if not isinstance(reply, dict):
            gist = " ".join(str(reply)[:80].split()) if reply is not None else "nothing"
            raise UnexpectedReply(f"the server at {self.url} answered {method} {path} with {gist!r}, not a JSON object: "
                                  "is another server listening there?")
        return reply

    @contextmanager
    def reading(self, what: str):
        """Around code that reads a reply to `what` ("GET /api/tags"): a field missing or of another type
        there (KeyError, TypeError ...) is an UnexpectedReply, one line for the CLI, not a traceback."""
        try:
            yield
        except MlxspecError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            detail = " ".join(f"{type(e).__name__}: {e}".split())[:120]
            raise UnexpectedReply(f"the server at {self.url} answered {what} with a reply no mlxspec daemon sends "
                                  f"({detail}): is another server listening there?") from None

    def stream(self, method: str, path: str, body: Any = None) -> Iterator[dict]:
        """NDJSON objects as they arrive; an `{"error": ...}` line raises ApiError.

        Every stream ends with a final object (`"done": true`, or `"status": "success"` for pull
        and create); one that ends without it was cut off (the daemon died) and raises StreamCutOff.
        """
        conn, resp = self._send(method, path, body)
        finished = False
        try:
            for line in _lines(resp, self.url):
                if not line.strip():
                    continue
                obj = _stream_object(line, self.url)
                if "error" in obj:
                    raise ApiError(str(obj["error"]), resp.status)
                finished = obj.get("done") is True or obj.get("status") == "success"
                yield obj
        finally:
            conn.close()  # closing early tells the daemon to stop the generation
        if not finished:
            raise StreamCutOff(f"the daemon at {self.url} closed the stream before it finished")

    def is_running(self, timeout: float = 2.0) -> bool:
        try:
            conn, resp = self._send("HEAD", "/", timeout=timeout)
        except (DaemonUnreachable, ApiError):
            return False
        conn.close()
        return True


def _lines(resp, url: str) -> Iterator[bytes]:
    """The response's lines; a connection lost mid-chunk is a StreamCutOff, not a traceback."""
    try:
        yield from resp
    except (http.client.HTTPException, OSError) as e:
        raise StreamCutOff(f"the connection to the daemon at {url} was lost ({type(e).__name__})") from None


def _early_answer(conn: http.client.HTTPConnection) -> http.client.HTTPResponse | None:
    """The answer a server sent before it stopped reading our body (a refusal), if one came."""
    try:
        return conn.getresponse()
    except (http.client.HTTPException, OSError):
        return None


def _stream_object(line: bytes, url: str) -> dict:
    try:
        obj = json.loads(line)
    except ValueError:
        raise StreamCutOff(f"the daemon at {url} sent a broken line: {line[:80]!r}") from None
    if not isinstance(obj, dict):
        raise StreamCutOff(f"the daemon at {url} sent {line[:80]!r}, not a JSON object")
    return obj


def _head_error(url: str, status: int) -> str:
    """A refused HEAD, whose answer has no body to quote: what its status means."""
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "refused"
    hint = ": set MLXSPEC_API_KEY to the daemon's key" if status == 401 else ""
    return f"the daemon at {url} answered HTTP {status} ({phrase}) when asked for a blob{hint}"


def _error_text(data: bytes, status: int) -> str:
    try:
        err = json.loads(data).get("error")
    except (ValueError, AttributeError):
        err = None
    if isinstance(err, dict):  # OpenAI's shape
        err = err.get("message")
    text = " ".join(data[:200].decode(errors="replace").split())  # an error page's lines: one line, as every error
    return str(err) if err else f"HTTP {status}: {text}"
