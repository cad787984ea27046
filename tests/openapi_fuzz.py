"""Requests generated from the daemon's own OpenAPI document, and answers checked against it (issue 14).

    calls = requests(doc, models, references)     # hypothesis strategy of Call(method, path, operation, body, mode)
    status, why, raw = send(url, call, doc)         # why: what broke the property, or None

Schemathesis turns the document into hypothesis strategies (hypothesis-jsonschema, the usual
choice, fails on this hypothesis: its object strategy uses a private API that changed). Modes:
- "valid": schemathesis's positive cases, as the schema allows (a 4xx then concerns the model, the
  store or a template, never a field's shape);
- "negative": schemathesis's negative cases: a schema broken (wrong types, missing required
  fields, values out of range, bodies that are not objects);
- "hostile": a valid body with one change JSON Schema cannot express: a value anywhere in the tree
  replaced by NaN / Infinity / a huge number, deep nesting, a lone surrogate, a huge string, or a
  field dropped, or unknown fields added, or one number field (or all) given a hostile number (10**400, NaN, -1 ...);
- "raw": bytes that are not a JSON object (truncated, nested past the parser's limit, binary).
Property per answer: no 5xx; the status is one the document lists for the operation; a 4xx is the
documented JSON error; a 200 matches the documented schema (each NDJSON line, each SSE event); no
internal error inside a stream. Shared by tests/server/test_fuzz.py and benchmarks/fuzz.py.

Bounds, chosen so a run stays short, not to hide anything: a valid body's num_predict / max_tokens /
max_output_tokens is at most 8 (a missing one is set to 4); hostile and negative values go anywhere.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

import jsonschema
from hypothesis import strategies as st


@dataclass
class Call:
    method: str
    path: str  # as sent (path parameters filled in)
    operation: str  # the document's path template
    body: object  # JSON-able, bytes, or None
    mode: str  # valid | mutated | raw | none


def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """One of the strategies, in proportion to its weight (st.one_of would favour the ones failing early)."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(lambda i: table[i])


# -- hostile values --------------------------------------------------------------------------------

HUGE = 10**30
NUMBERS = st.sampled_from([0, -1, -2, 1, 2**31, 2**63, 2**64, -(2**63) - 1, HUGE, -HUGE, 10**400, -(10**400),
                           0.5, -0.0, 1e-300, 1e-39, 1e308, float("nan"), float("inf"), float("-inf")])
LONE_SURROGATES = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3)
ODD_TEXT = st.sampled_from(["", " ", "\x00", "\u202e", "{{", "{% for x in y %}", "{{ raise_exception('x') }}",
                            "{{ .Tools }}", "{{ range .Messages }}", "<|im_start|>", "<|endoftext|>", "../../etc/passwd",
                            "/etc/passwd", "/proc/self/mem", "pypi:x/../../etc/passwd", "a" * 300, "org/repo", "tiny:",
                            ":x", "NS/Fz:TAG", "\U0001F600" * 50, "5m", "nan", "-1", "1e400"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), NUMBERS, st.floats(), ODD_TEXT, st.text(max_size=20))
ANY_JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                        max_leaves=10)


def deep(n: int, kind: str) -> object:
    value: object = 1
    for _ in range(n):
        value = [value] if kind == "list" else {"a": value}
    return value


WEIRD = weighted((6, ANY_JSON), (1, st.builds(deep, st.sampled_from([50, 500]), st.sampled_from(["list", "dict"]))),
                 (1, LONE_SURROGATES), (1, st.integers(1, 200_000).map(lambda n: "ab " * n)))  # up to 600 KB
RAW = st.one_of(st.binary(max_size=64), st.sampled_from(
    [b"[", b"{\"model\": ", b"null", b"[]", b"\"x\"", b"{\"model\": \"tiny\", \"prompt\": \"\\ud800\"}",
     b"[" * 100_000, b"{\"a\":" * 50_000, b"NaN", b"{\"model\": \"tiny\"} trailing",
     b"{\"model\": \"tiny\", \"options\": {\"num_ctx\": 1" + b"0" * 5000 + b"}}"]))  # past Python's int digits


# -- from the document -----------------------------------------------------------------------------


def inline(doc: dict, schema):
    """The schema with every #/components/schemas/X reference replaced by X (none is recursive)."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            return inline(doc, doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]])
        return {k: inline(doc, v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [inline(doc, v) for v in schema]
    return schema


def formats(models: list[str], references: list[str]) -> dict:
    """Strategies for the document's custom string formats."""
    names = weighted((6, st.sampled_from(models)), (1, st.sampled_from(["nope", "NS/Fz:TAG", "org/repo", "a" * 90, "x:y:z"])))
    refs = weighted((4, st.sampled_from(models + references)),
                    (1, st.sampled_from(["org/repo", "/etc/passwd", "/proc/self/environ", "pypi:nope/x.gguf", "~", "/",
                                         "smollm2-135m", "pypi:x/../../etc/passwd", "/" + "a" * 300])))
    args = st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3).map(json.dumps)
    return {"model-name": names, "model-reference": refs, "json-object": args,
            "duration": st.sampled_from(["5m", "0", "-1", "1h30m", "300ms", "0s", "10", "2h"])}


def requests(doc: dict, models: list[str], references: list[str]) -> st.SearchStrategy:
    """Calls over every operation of the document; `models` are store names worth aiming at,
    `references` model paths /api/create may use."""
    import schemathesis
    from schemathesis.generation.modes import GenerationMode

    calls = []
    for op in _operations(doc, models, references):
        valid = op.as_strategy(GenerationMode.POSITIVE).map(lambda case, op=op: _call(op, case, "valid", models))
        if "requestBody" not in op.definition.raw:  # GET / HEAD: no body, now and then one anyway
            weird = st.tuples(valid, WEIRD).map(lambda t: _with(t[0], body=t[1], mode="hostile"))
            calls.append(weighted((6, valid), (1, weird)) if op.method != "head" else valid)
            continue
        negative = op.as_strategy(GenerationMode.NEGATIVE).map(lambda case, op=op: _call(op, case, "negative", models))
        hostile = _mutated(valid)
        raw = st.tuples(valid, RAW).map(lambda t: _with(t[0], body=t[1], mode="raw"))
        mix = weighted((3, valid), (2, negative), (2, hostile), (1, raw))
        calls.append((3, mix) if op.path in GENERATION else (1, mix))
    unknown = st.builds(Call, st.sampled_from(["GET", "POST", "PUT"]), st.sampled_from(["/api/nope", "/v2/x"]),
                        st.just("?"), st.none(), st.just("none"))
    return weighted(*[c if isinstance(c, tuple) else (1, c) for c in calls], (1, unknown))


GENERATION = ("/api/generate", "/api/chat", "/v1/chat/completions", "/v1/completions")  # drawn 3x as often: the deep paths


def valid_requests(doc: dict, models: list[str], references: list[str], path: str) -> st.SearchStrategy:
    """Schema-valid calls of the POST operation at `path` alone."""
    from schemathesis.generation.modes import GenerationMode

    op = next(op for op in _operations(doc, models, references) if op.path == path and op.method == "post")
    return op.as_strategy(GenerationMode.POSITIVE).map(lambda case: _call(op, case, "valid", models))


def _operations(doc: dict, models: list[str], references: list[str]) -> list:
    import schemathesis

    for name, strategy in formats(models, references).items():
        schemathesis.openapi.format(name, strategy)
    return [result.ok() for result in schemathesis.openapi.from_dict(copy.deepcopy(doc)).get_all_operations()]


def _call(op, case, mode: str, models: list[str]) -> Call:
    from schemathesis.core import NotSet

    path = op.path
    for key, value in (case.path_parameters or {}).items():  # schemathesis gives them percent-encoded already
        path = path.replace("{" + key + "}", quote(unquote(str(value)), safe="/:", errors="surrogatepass"))
    body = None if isinstance(case.body, NotSet) else case.body
    body = body.data if isinstance(getattr(body, "data", None), bytes) else body  # format: binary -> the bytes
    if mode == "valid" and isinstance(body, dict):
        body = _bounded(op.path, body)
    if isinstance(body, dict):
        body = _protected(op.path, body, models)
    return Call(op.method.upper(), path, op.path, body, mode)


def _with(call: Call, **changes) -> Call:
    return Call(**{**call.__dict__, **changes})


SMALL_PREDICT = ("num_predict", "max_tokens", "max_completion_tokens", "max_output_tokens")
MAKES_OR_REMOVES = {"/api/create": "model", "/api/delete": "model", "/api/copy": "destination"}


def _bounded(template: str, body: dict) -> dict:
    """Keep generation short: at most 8 tokens."""
    body = dict(body)
    if template in ("/api/generate", "/api/chat"):
        options = dict(body.get("options") or {})
        if not 0 <= options.get("num_predict", 9) <= 8:
            options["num_predict"] = 4
        options.pop("max_tokens", None)
        body["options"] = options
    if template in LENGTHS:
        for key in LENGTHS[template]:
            if key in body and not 1 <= body[key] <= 8:
                body[key] = 4
        body.setdefault(LENGTHS[template][0], 4)
        if isinstance(body.get("options"), dict):
            body["options"] = {k: v for k, v in body["options"].items() if k not in SMALL_PREDICT}
    return body


# the fields that bound an answer's length, per OpenAI / Anthropic operation (the first one set where none is)
LENGTHS = {"/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
           "/v1/completions": ("max_tokens", "max_completion_tokens"),
           "/v1/responses": ("max_output_tokens",), "/v1/messages": ("max_tokens",)}


def _protected(template: str, body: dict, models: list[str]) -> dict:
    """Create, copy and delete aim at names of their own (fz-...), never at the models the others use."""
    if template not in MAKES_OR_REMOVES:
        return body
    body = dict(body)
    for key in ("model", "name", MAKES_OR_REMOVES[template]):
        if isinstance(body.get(key), str) and body[key].split(":")[0] in models:
            body[key] = "fz-" + body[key].replace(":", "-")
    return body


def _paths(value, at=()) -> list[tuple]:
    """Every position in a JSON tree (the root included)."""
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, at + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, at + (i,))
    return out


def _at(value, at: tuple):
    for key in at:
        value = value[key]
    return value


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _replace(value, at: tuple, new):
    if not at:
        return new
    value = copy.copy(value)
    value[at[0]] = _replace(value[at[0]], at[1:], new)
    return value


def _mutated(valid: st.SearchStrategy) -> st.SearchStrategy:
    """A valid call whose body gets one hostile change."""
    def mutate(args, number) -> Call:
        call, kind, pick, weird, extra = args
        body = call.body
        if kind == "drop" and isinstance(body, dict) and body:
            key = sorted(body)[pick % len(body)]
            body = {k: v for k, v in body.items() if k != key}
        elif kind == "extra" and isinstance(body, dict):
            body = {**body, **extra}
        elif kind in ("number", "numbers") and (numbers := [at for at in _paths(body)[1:] if _is_number(_at(body, at))
                                                             and at[-1] not in SMALL_PREDICT]):  # (huge: a long answer)
            # one number field, or all of them, given a hostile number: found by "replace" only once in hundreds
            for at in numbers if kind == "numbers" else [numbers[pick % len(numbers)]]:
                body = _replace(body, at, number)
        else:
            positions = _paths(body)[1:] or [()]
            body = _replace(body, positions[pick % len(positions)], weird)
        return _with(call, body=body, mode="hostile")

    return st.tuples(valid, st.sampled_from(["drop", "replace", "replace", "replace", "extra", "number", "numbers"]),
                     st.integers(0, 10**6), WEIRD, st.dictionaries(st.text(max_size=12), WEIRD, min_size=1, max_size=2),
                     NUMBERS).map(lambda t: mutate(t[:5], t[5]))


# -- sending and checking ---------------------------------------------------------------------------


def encode(body) -> bytes:
    """JSON as a client would send it (NaN/Infinity literals included: Python's json writes them)."""
    if body is None:
        return b""
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    return json.dumps(body).encode()


def send(url: str, call: Call, doc: dict, timeout: float = 120) -> tuple[int | None, str | None, bytes]:
    """Send one call; (status, what broke the property or None, the body). status None: no answer."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(call.method, call.path, body=encode(call.body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        status, kind, raw = resp.status, resp.getheader("Content-Type", ""), resp.read()
    except (OSError, http.client.HTTPException) as e:
        return None, f"no answer: {type(e).__name__}: {e}", b""
    finally:
        conn.close()
    return status, problem(doc, call, status, kind.split(";")[0].strip(), raw), raw


# 4xx messages that mean "this field has the wrong shape": a body valid under the schema must not get them
SHAPE = re.compile(r" must be |unknown option|invalid option| is required|must not be empty|not a JSON object")


def problem(doc: dict, call: Call, status: int, kind: str, raw: bytes) -> str | None:
    """What is wrong with an answer, by the document; None when it is as documented."""
    text = raw.decode("utf-8", "replace")
    if status >= 500:
        return f"{status}: {text[:300]}"
    op = doc["paths"].get(call.operation, {}).get(call.method.lower())
    if op is None:  # not an operation: an unknown path or method
        return None if status in (404, 405) else f"{status} for an unknown route"
    answer = op["responses"].get(str(status))
    if answer is None:
        return f"status {status} is not documented for {call.method} {call.operation}: {text[:200]}"
    if call.method == "HEAD" or "content" not in answer:
        return None if call.method == "HEAD" or not raw else f"{status} with a body the document does not describe"
    content = answer["content"].get(kind)
    if content is None:
        return f"{status} as {kind!r}, which the document does not list: {text[:200]}"
    why = _mismatch(doc, content["schema"], kind, text)
    if why:
        return f"{status} {kind} does not match the document: {why}"
    if status == 400 and call.mode == "valid" and SHAPE.search(text):  # the schema and the handler disagree
        return f"{status} for a body the schema allows: {text[:200]} <- {json.dumps(call.body)[:300]}"
    if "internal error" in text:
        return f"{status} with an internal error inside: {text[-300:]}"
    return None


def _mismatch(doc: dict, schema: dict, kind: str, text: str) -> str | None:
    if kind == "text/plain":
        return None
    if kind == "application/x-ndjson":
        items = [line for line in text.splitlines() if line.strip()]
    elif kind == "text/event-stream":
        items = [line[6:] for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
    else:
        items = [text]
    validator = _validator(json.dumps(schema, sort_keys=True), doc)
    for item in items:
        try:
            validator.validate(json.loads(item))
        except ValueError:
            return f"not JSON: {item[:200]}"
        except jsonschema.ValidationError as e:
            return f"{e.message[:200]} at {list(e.absolute_path)}"
    return None


_VALIDATORS: dict = {}


def _validator(key: str, doc: dict):
    if key not in _VALIDATORS:
        _VALIDATORS[key] = jsonschema.Draft202012Validator(inline(doc, json.loads(key)))
    return _VALIDATORS[key]
