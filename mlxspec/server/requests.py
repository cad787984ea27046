"""Reading request bodies: JSON objects, typed fields and keep_alive durations, or a 4xx ApiError."""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError


class ApiError(Exception):
    """A request the server refuses: HTTP `status` with `{"error": message}`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# What aiohttp can decompress; anything else would be read as if it were plain JSON.
_ENCODINGS = ("", "identity", "gzip", "x-gzip", "deflate")


async def read_json(request: web.Request) -> dict:
    """The body as a JSON object; an empty body is {} (GET-like POSTs such as /api/tags)."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in _ENCODINGS:
        raise ApiError(415, f"unsupported Content-Encoding {encoding!r}: send gzip, deflate or none")
    try:
        raw = await request.read()  # refuses bodies over client_max_size with 413
    except web.HTTPException:
        raise
    except (RequestPayloadError, HttpProcessingError) as e:  # Content-Encoding: gzip on a body that is not
        raise ApiError(400, f"the body is not valid {encoding or 'plain'} data ({type(e).__name__})") from None
    if not raw.strip():
        return {}
    body = _parse(raw)
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _parse(raw: bytes) -> Any:
    try:
        body = json.loads(raw)
        # A lone surrogate ("\ud800") is valid JSON but not text: tokenizers fail on it later.
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"invalid JSON body: {e}") from None
    except UnicodeEncodeError:
        raise ApiError(400, "invalid JSON body: a string holds a lone surrogate (\\ud800-\\udfff), which is not text") from None
    except RecursionError:
        raise ApiError(400, "invalid JSON body: nested too deeply") from None
    except ValueError:  # json.loads's only other error: an integer of more digits than Python converts
        raise ApiError(400, f"invalid JSON body: a number has more than {sys.get_int_max_str_digits()} digits") from None
    return body


_NAMES = {str: "a string", bool: "a boolean", dict: "an object", list: "a list", int: "an integer"}


def field(body: dict, key: str, kind: type | tuple, default: Any = None, required: bool = False) -> Any:
    """body[key] checked against `kind` (bool is not an int here); missing -> default or 400."""
    value = body.get(key)
    if value is None:
        if required:
            raise ApiError(400, f"{key} is required")
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if int in kinds and float not in kinds and isinstance(value, float) and value.is_integer():
        return int(value)  # JSON has one number type: 4.0 is 4
    if isinstance(value, bool) and bool not in kinds:
        ok = False
    else:
        ok = isinstance(value, kinds) or (float in kinds and isinstance(value, int))
    if not ok:
        what = " or ".join(_NAMES.get(k, "a number") for k in kinds)
        raise ApiError(400, f"{key} must be {what}")
    return value


def model_field(body: dict) -> str:
    """The model name: `model`, or the legacy `name` some clients still send."""
    name = field(body, "model", str) or field(body, "name", str)
    if not name:
        raise ApiError(400, "model is required")
    return name


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_BARE_SECONDS = re.compile(r"\d+(?:\.\d*)?|\.\d+")  # digits only: 'nan', 'inf', '1e400' are not durations
# Go's time.Duration is int64 nanoseconds (~292 years); Ollama refuses longer durations, so do we.
MAX_DURATION = (2**63 - 1) / 1e9


def parse_duration(value: Any, what: str = "keep_alive") -> float:
    """Seconds from a number (seconds) or a Go-style duration string ('5m', '1h30m', '300ms', '-1').

    As Ollama: negative means forever, 0 unload now; NaN, infinities, overflow and garbage -> 400.
    """
    seconds = _duration_seconds(value)
    if seconds is None or not math.isfinite(seconds) or abs(seconds) > MAX_DURATION:
        raise ApiError(400, f"invalid {what} {repr(value)[:40]}: use seconds or a duration such as '5m', '1h30m', '-1'")
    return seconds


def _duration_seconds(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # a JSON integer with hundreds of digits
            return None
    if not isinstance(value, str):
        return None
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text[1:] if text[:1] in "+-" else text
    if _BARE_SECONDS.fullmatch(body):  # a bare number of seconds, as OLLAMA_KEEP_ALIVE allows
        return sign * float(body)
    parts = _DURATION.findall(body)
    if parts and "".join(n + u for n, u in parts) == body:
        return sign * sum(float(n) * _UNITS[u] for n, u in parts)
    return None


def format_field(value) -> str | dict | None:
    """Ollama's `format` ("json" or a JSON schema) checked now, so a bad schema is a 400 before queueing."""
    from ..constraints import format_grammar

    if value in (None, ""):
        return None
    format_grammar(value)  # FormatError (400) naming the problem
    return value


def check_tools(tools: list | None) -> list | None:
    """Function tools (OpenAI's shape, Ollama's too), checked before a template sees them: a malformed one was a
    template error or a 500."""
    for i, tool in enumerate(tools or []):
        where, fn = f"tools[{i}]", tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or tool.get("type", "function") != "function":
            raise ApiError(400, f'{where} must be {{"type": "function", "function": {{"name": ...}}}} (only function tools are supported)')
        if not isinstance(fn.get("name"), str):
            raise ApiError(400, f"Missing required parameter: '{where}.function.name'.")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise ApiError(400, f"{where}.function.parameters must be an object (a JSON schema)")
    return tools
