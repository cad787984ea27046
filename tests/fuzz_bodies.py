"""Hypothesis strategies for hostile requests to every daemon endpoint (issue 14).

`requests(models)` draws (method, path, body) where body is a JSON-able value or raw bytes.
Each endpoint mixes plausible fields (so requests get past the first check and reach the model)
with adversarial ones: wrong types, huge / negative / NaN numbers, deep nesting, lone surrogates,
huge strings, unknown fields. Shared by tests/server/test_fuzz.py and benchmarks/fuzz.py.

Bounds, chosen so a run stays short, not to hide anything: a valid `num_predict` / `max_tokens`
is at most 8 (a missing one is set to 4) - other values are still drawn, all of them invalid.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st


def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """One of the strategies, picked in proportion to its weight (st.one_of of repeated strategies
    is not: hypothesis collapses the repeats and favours the branches whose values fail early)."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(lambda i: table[i])


HUGE = 10**30
# Numbers that break naive code: overflow, NaN, negative zero, floats where ints are expected.
NUMBERS = st.sampled_from([0, -1, -2, 1, 2**31, 2**63, 2**64, -(2**63) - 1, HUGE, -HUGE, 10**400,
                           0.5, -0.0, 1e-300, 1e308, float("nan"), float("inf"), float("-inf")])
LONE_SURROGATES = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3)
# Text a well-behaved client might send (huge, control characters, template syntax), and worse.
TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["Once upon a time", "def add(a, b):", "", " ", "\x00", "\u202e", "{{", "{% for x in y %}",
                     "<|im_start|>", "<|endoftext|>", "\U0001F600" * 50]),
    st.integers(1, 200_000).map(lambda n: "ab " * n),  # up to 600 KB: under the 16 MB body limit
)
# Lone surrogates are refused first, as the body is parsed: kept rare, or they would hide the other checks.
ODD_TEXT = weighted(
    (4, TEXT),
    (1, LONE_SURROGATES),
    (2, st.sampled_from(["", " ", "\x00", "\u202e", "{{", "{% for x in y %}", "{{ raise_exception('x') }}",
                         "<|im_start|>", "<|endoftext|>", "../../etc/passwd", "/etc/passwd", "/proc/self/mem",
                         "pypi:x/../../etc/passwd", "a" * 300, "org/repo", "tiny:", ":x", "NS/Fz:TAG"])),
)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), NUMBERS, st.floats(), ODD_TEXT)
ANY_JSON = st.recursive(SCALARS,
                        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ODD_TEXT, inner, max_size=4),
                        max_leaves=12)


def deep(n: int, kind: str) -> object:
    value: object = 1
    for _ in range(n):
        value = [value] if kind == "list" else {"a": value}
    return value


DEEP = st.builds(deep, st.sampled_from([50, 500]), st.sampled_from(["list", "dict"]))
WEIRD = st.one_of(ANY_JSON, DEEP)


def either(plausible: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly a plausible value, sometimes anything at all."""
    return weighted((7, plausible), (1, WEIRD))


def body(required: dict, optional: dict) -> st.SearchStrategy:
    """A JSON object: half the time plausible fields only (to reach the model), else any field may be
    anything, a required one may be missing, and unknown fields come along."""
    plausible = st.fixed_dictionaries(required, optional=optional)
    hostile = st.tuples(
        st.fixed_dictionaries({k: either(v) for k, v in required.items()},
                              optional={k: either(v) for k, v in optional.items()}),
        st.dictionaries(TEXT, WEIRD, max_size=2),
        st.sampled_from([None, None, None, *required]),
    ).map(lambda t: {**{k: v for k, v in t[0].items() if k != t[2]}, **t[1]})
    return weighted((2, plausible), (1, hostile))


def with_small_predict(options: dict, key: str = "num_predict") -> dict:
    return options if key in options else {**options, key: 4}


SMALL = st.integers(0, 8)
OPTION_VALUES = {
    "num_predict": st.one_of(SMALL, NUMBERS.filter(lambda x: not (isinstance(x, int) and 8 < x)), st.text(max_size=3)),
    "temperature": st.one_of(st.floats(), NUMBERS, st.just("0.5")),
    "top_k": st.one_of(st.integers(-5, 50), NUMBERS), "top_p": st.one_of(st.floats(), NUMBERS),
    "min_p": st.one_of(st.floats(), NUMBERS), "seed": st.one_of(st.integers(), NUMBERS),
    "stop": st.one_of(ODD_TEXT, st.lists(ODD_TEXT, max_size=3)),
    "repeat_penalty": st.one_of(st.floats(), NUMBERS), "repeat_last_n": st.one_of(st.integers(-3, 100), NUMBERS),
    "num_ctx": st.one_of(st.integers(-2, 64), NUMBERS), "draft_length": st.one_of(st.integers(-2, 40), NUMBERS),
    "draft_num_predict": st.integers(-2, 40), "adaptive": st.one_of(st.booleans(), SCALARS), "num_gpu": SCALARS,
    "mirostat": SCALARS,
}
GOOD_OPTIONS = st.fixed_dictionaries({}, optional={
    "num_predict": SMALL, "temperature": st.floats(0, 2), "top_k": st.integers(0, 50), "top_p": st.floats(0.01, 1),
    "min_p": st.floats(0, 0.99), "seed": st.integers(0, 2**64 - 1), "stop": st.lists(TEXT.filter(bool), max_size=3),
    "repeat_penalty": st.floats(0.01, 10), "repeat_last_n": st.integers(-1, 100), "num_ctx": st.integers(1, 4096),
    "draft_num_predict": st.integers(0, 32), "adaptive": st.booleans(), "num_gpu": st.integers(0, 99)})
OPTIONS = weighted((3, GOOD_OPTIONS), (1, st.fixed_dictionaries({}, optional=OPTION_VALUES))).map(with_small_predict)
CONTEXT = st.lists(st.one_of(st.integers(0, 320), st.integers(), NUMBERS, SCALARS), max_size=20)
ROLES = weighted((6, st.just("user")), (1, st.sampled_from(["system", "assistant", "tool", "developer", "", "robot"])))
PART = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"])},
                             optional={"text": either(TEXT), "image_url": WEIRD})
CONTENT = st.one_of(TEXT, st.lists(PART, max_size=3))
MESSAGE = st.fixed_dictionaries({"role": ROLES, "content": CONTENT}, optional={
    "images": either(st.just([])), "tool_calls": either(st.just([])), "name": TEXT, "tool_call_id": TEXT})
MESSAGES = weighted((3, st.lists(MESSAGE, min_size=1, max_size=4)), (1, st.lists(either(MESSAGE), max_size=4)))
KEEP_ALIVE = st.one_of(st.sampled_from([0, -1, "5m", "1h30m", "0s", "", "nan", "-5m", "1e400", 300]), NUMBERS)
FUNCTION = st.fixed_dictionaries({"name": TEXT}, optional={"parameters": either(st.just({"type": "object"}))})
TOOLS = st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": FUNCTION}), max_size=2)
FORMAT = st.sampled_from(["", "json", "xml", {"type": "object"}, None])


def requests(models: list[str]) -> st.SearchStrategy:
    """(method, path, body) over every endpoint; `models` are names worth aiming at."""
    model = weighted((4, st.sampled_from(models)), (1, ODD_TEXT))
    context = st.lists(st.integers(0, 400), max_size=20) | CONTEXT  # the tiny models' vocabulary is 320
    created = st.sampled_from(["fz", "fz2", "fz:tag", "ns/fz"]) | ODD_TEXT  # names fuzz may create or delete
    ref = st.sampled_from(models + ["org/repo", "/etc/passwd", "pypi:nope/x.gguf", "~", "/", "smollm2-135m"]) | ODD_TEXT
    generate = body({"model": model}, {
        "prompt": TEXT, "suffix": TEXT, "system": TEXT, "template": TEXT, "raw": st.booleans(),
        "context": context, "options": OPTIONS, "stream": st.booleans(), "keep_alive": KEEP_ALIVE,
        "format": FORMAT, "images": either(st.just([])), "think": either(st.just(False)),
        "logprobs": either(st.just(False))})
    chat = body({"model": model, "messages": MESSAGES}, {
        "options": OPTIONS, "stream": st.booleans(), "keep_alive": KEEP_ALIVE, "tools": TOOLS, "format": FORMAT,
        "think": either(st.just(False))})
    openai_common = {
        "max_tokens": st.one_of(SMALL, SMALL, NUMBERS), "max_completion_tokens": st.one_of(SMALL, SMALL, NUMBERS),
        "temperature": st.floats(0, 2) | NUMBERS, "top_p": st.floats(0.01, 1) | NUMBERS,
        "seed": st.integers(0, 99) | NUMBERS, "stop": TEXT | st.lists(TEXT, max_size=5), "stream": st.booleans(),
        "n": st.sampled_from([1, 1, 1, 0, -1, 2]), "presence_penalty": st.just(0) | NUMBERS,
        "frequency_penalty": st.just(0) | NUMBERS, "logprobs": either(st.just(False)),
        "response_format": either(st.sampled_from([{"type": "text"}, {"type": "json_object"}, None])),
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": either(st.booleans())}),
        "options": OPTIONS}
    v1_chat = body({"model": model, "messages": MESSAGES}, {**openai_common, "tools": TOOLS})
    v1_text = body({"model": model, "prompt": TEXT | st.lists(TEXT | CONTEXT, max_size=3)},
                   {**openai_common, "suffix": TEXT, "echo": st.booleans()})
    create = body({"model": created, "from": ref}, {
        "draft": ref,
        "drafter": st.sampled_from(["draft-model", "lookup", "early-exit:1", "early-exit:999", "nope", ""]) | TEXT,
        "quantize": st.sampled_from(["q4", "q8", "q4g32", "x"]) | TEXT, "draft_quantize": TEXT,
        "template": TEXT, "system": TEXT, "draft_length": NUMBERS | st.integers(-2, 40),
        "parameters": st.one_of(OPTIONS, st.dictionaries(TEXT, WEIRD, max_size=3)), "stream": st.booleans(),
        "files": either(st.just({})), "adapters": either(st.just([])), "messages": either(st.just([]))})
    named = body({"model": model},
                 {"name": model, "verbose": st.booleans(), "stream": st.booleans(), "insecure": st.booleans()})
    copy = body({"source": model, "destination": created}, {})
    delete = body({"model": created}, {"name": created})
    embed = body({"model": model}, {"input": TEXT, "prompt": TEXT})
    posts = [("/api/generate", generate), ("/api/chat", chat), ("/api/create", create), ("/api/show", named),
             ("/api/pull", named), ("/api/copy", copy), ("/api/embed", embed), ("/api/embeddings", embed),
             ("/v1/chat/completions", v1_chat), ("/v1/completions", v1_text), ("/v1/embeddings", embed)]
    calls = [st.tuples(st.just("POST"), st.just(p), b) for p, b in posts]
    calls.append(st.tuples(st.just("DELETE"), st.just("/api/delete"), delete))
    # GET endpoints take no body; send one anyway now and then
    gets = st.sampled_from(["/api/tags", "/api/ps", "/api/version", "/v1/models", "/", "/v1/models/tiny",
                            "/v1/models/%ED%A0%80", "/v1/models/..%2F..%2Fetc", "/api/nope"])
    calls.append(st.tuples(st.just("GET"), gets, st.none() | WEIRD))
    # raw bodies: not JSON, not an object, truncated, nested past the parser's limit
    raw = st.one_of(st.binary(max_size=64), st.sampled_from([b"[", b"{\"model\": ", b"null", b"[]", b"\"x\"",
                                                             b"{\"model\": \"tiny\", \"prompt\": \"\\ud800\"}",
                                                             b"[" * 100_000, b"{\"a\":" * 50_000, b"NaN"]))
    calls.append(st.tuples(st.just("POST"), st.sampled_from([p for p, _ in posts]), raw))
    return st.one_of(calls)


def encode(body) -> bytes:
    """JSON as a client would send it (NaN/Infinity literals included: Python's json accepts them)."""
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    return json.dumps(body).encode()


def send(url: str, method: str, path: str, body, timeout: float = 120) -> tuple[int | None, str | None, bytes]:
    """Send one request; returns (status, what broke the property or None, the body). status None: no answer."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(method, path, body=encode(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        status, raw = resp.status, resp.read()
    except (OSError, http.client.HTTPException) as e:
        return None, f"no answer: {type(e).__name__}: {e}", b""
    finally:
        conn.close()
    return status, problem(path, status, raw), raw


def problem(path: str, status: int, raw: bytes) -> str | None:
    """What is wrong with an answer: a 5xx, a 4xx without a JSON error message, an internal error mid-stream."""
    text = raw.decode("utf-8", "replace")
    if status >= 500:
        return f"{status}: {text[:300]}"
    if status >= 400:
        try:
            error = json.loads(raw)["error"]
            message = error["message"] if path.startswith("/v1/") else error
        except (ValueError, KeyError, TypeError):
            return f"{status} without a JSON error: {text[:300]}"
        return None if isinstance(message, str) and message else f"{status} with an empty error: {text[:300]}"
    if "internal error" in text:  # a 200 stream that failed part-way on something unexpected
        return f"{status} with an internal error inside: {text[-300:]}"
    return None
