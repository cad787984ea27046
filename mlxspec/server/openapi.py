"""The daemon's own OpenAPI 3.1 description, served at GET /api/openapi.json (and /openapi.json).

Every route the daemon serves is here (tests/server/test_openapi.py compares this with the router,
so a route added without a description fails), with the request bodies of api_schemas.py, the
answers by status and the error shapes: `{"error": "..."}` under /api/, OpenAI's
`{"error": {"message", "type", "param", "code"}}` under /v1/. The fuzz tests generate their
requests from this document and check each answer against it.
"""

from __future__ import annotations

import functools
from importlib.metadata import version as package_version

from aiohttp import web

from . import api_schemas as s

routes = web.RouteTableDef()

# (method, path, tag, summary, request schema or "binary" (raw bytes),
#  answers: "json" | "ndjson" | "sse" | "text" | "empty" | "created" (201, or 200: had it already), schema)
OPERATIONS = [
    ("get", "/", "ollama", "Heartbeat: 'Ollama is running' (Ollama's words, which clients probe for)", None, "text", None),
    ("get", "/api/version", "ollama", "The Ollama API level followed, and mlxspec's version", None, "json", "Version"),
    ("post", "/api/generate", "ollama", "Complete a prompt (empty prompt: load; keep_alive 0: unload)",
     "GenerateRequest", "ndjson", "GenerateResponse"),
    ("post", "/api/chat", "ollama", "Chat (no messages: load; keep_alive 0: unload)", "ChatRequest", "ndjson", "ChatResponse"),
    ("post", "/api/embed", "ollama", "Embeddings: the last token's final hidden state, L2-normalized, one per input",
     "EmbedRequest", "json", "EmbedResponse"),
    ("post", "/api/embeddings", "ollama", "Embeddings (older form): one prompt, one vector", "EmbedRequest", "json",
     "EmbeddingResponse"),
    ("get", "/api/tags", "ollama", "The stored models", None, "json", "Tags"),
    ("post", "/api/show", "ollama", "A model's Modelfile, parameters, template, details, capabilities", "NamedRequest",
     "json", "Show"),
    ("get", "/api/ps", "ollama", "The loaded models", None, "json", "Ps"),
    ("post", "/api/pull", "ollama", "Download a model (a name from models/ or a Hugging Face repo id)", "NamedRequest",
     "ndjson", "Status"),
    ("post", "/api/create", "ollama", "Create a model (Ollama's create request, Modelfile fields, mlxspec's drafting)",
     "CreateRequest", "ndjson", "Status"),
    ("head", "/api/blobs/{digest}", "ollama", "Is this blob uploaded? 200 yes, 404 no", None, "empty", None),
    ("post", "/api/blobs/{digest}", "ollama", "Upload a model file, the raw bytes, under its sha256 digest (for "
     "/api/create's files); a body of another digest is a 400 and nothing is kept", "binary", "created", None),
    ("post", "/api/copy", "ollama", "Copy a model under another name", "CopyRequest", "empty", None),
    ("delete", "/api/delete", "ollama", "Remove a model from the store", "NamedRequest", "empty", None),
    ("post", "/v1/chat/completions", "openai", "OpenAI chat completions", "ChatCompletionRequest", "sse", "ChatCompletion"),
    ("post", "/v1/completions", "openai", "OpenAI text completions", "CompletionRequest", "sse", "Completion"),
    ("post", "/v1/responses", "openai", "OpenAI Responses (stateless: the whole conversation in input)",
     "ResponsesRequest", "sse", "Response"),
    ("post", "/v1/messages", "anthropic", "Anthropic Messages (Claude Code and Anthropic clients)", "MessagesRequest",
     "sse", "AnthropicMessage"),
    ("post", "/v1/messages/count_tokens", "anthropic", "The input_tokens /v1/messages would count for this body "
     "(its prompt built, not run)", "CountTokensRequest", "json", "TokenCount"),
    ("get", "/v1/models", "openai", "The stored models", None, "json", "Models"),
    ("get", "/v1/models/{model}", "openai", "One stored model", None, "json", "Model"),
    ("post", "/v1/embeddings", "openai", "OpenAI embeddings (float or base64)", "EmbeddingsRequest", "json", "Embeddings"),
    ("get", "/api/openapi.json", "mlxspec", "This document", None, "json", None),
    ("get", "/openapi.json", "mlxspec", "This document", None, "json", None),
]
SSE_CHUNKS = {"ChatCompletion": "ChatCompletionChunk", "Completion": "Completion", "Response": "ResponseEvent",
              "AnthropicMessage": "AnthropicEvent"}
ERRORS = {
    400: "the request is wrong (a field, a value, a template, a reference): the message says what",
    401: "MLXSPEC_API_KEY is set and the request lacks `Authorization: Bearer <key>`",
    403: "a Host or Origin not allowed, or a local path outside MLXSPEC_MODEL_DIRS",
    404: "no such model (or file, or blob)",
    413: "the body is larger than MLXSPEC_MAX_BODY",
    415: "a Content-Encoding other than gzip, deflate or none",
    500: "a failure of mlxspec's own (logged with its traceback); never a caller's mistake",
    503: "busy: the model limit or the queue is full; retry after Retry-After seconds",
}
BODY_ERRORS = (400, 401, 403, 404, 413, 415, 500, 503)  # what a request with a body may get
GET_ERRORS = (401, 403, 500)
PATH_PARAMETERS = {"model": s.MODEL, "digest": s.DIGEST}


@functools.lru_cache(maxsize=1)
def document() -> dict:
    """The document (built once; do not change what it returns)."""
    paths: dict = {}
    for method, path, tag, summary, request, answers, schema in OPERATIONS:
        paths.setdefault(path, {})[method] = _operation(method, path, tag, summary, request, answers, schema)
        if method == "get":  # aiohttp answers HEAD on every GET route
            head = _operation("head", path, tag, summary + " (headers only)", None, "empty", None)
            paths[path]["head"] = head
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "mlxspec daemon", "version": package_version("mlxspec"),
            "description": "Ollama's API (/api/*) and OpenAI's (/v1/*), served by mlxspec. Errors: "
                           "{\"error\": message} under /api/, OpenAI's error object under /v1/. A failure after a "
                           "stream started is its last line ({\"error\": ...}) or event. Every GET also answers HEAD; "
                           "CORS preflights (OPTIONS with an allowed Origin) are answered on any path.",
        },
        "servers": [{"url": "http://127.0.0.1:11435"}],
        "paths": paths,
        "components": {"schemas": s.SCHEMAS},
    }


def _operation(method, path, tag, summary, request, answers, schema) -> dict:
    op = {"operationId": f"{method}_{path.strip('/').replace('/', '_').replace('.', '_').replace('{', '').replace('}', '') or 'root'}",
          "tags": [tag], "summary": summary, "responses": {}}
    if params := [{"name": k, "in": "path", "required": True, "schema": v} for k, v in PATH_PARAMETERS.items()
                  if "{" + k + "}" in path]:
        op["parameters"] = params
    if request == "binary":
        op["requestBody"] = {"required": True,
                             "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}
    elif request:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": s.ref(request)}}}
    error = s.ref("OpenAIError" if path.startswith("/v1/") else "Error")
    if answers == "created":
        op["responses"]["200"] = {"description": "stored already (the body is read, not kept)"}
        op["responses"]["201"] = {"description": "stored"}
    elif answers != "error":
        op["responses"]["200"] = _ok(answers, schema, error)
    codes = BODY_ERRORS if request or "{model}" in path else GET_ERRORS
    codes = (*codes, 400, 404) if params else codes  # a malformed parameter, or nothing under it
    for code in sorted(set(codes)):
        op["responses"][str(code)] = {"description": ERRORS[code]} if method == "head" else \
            {"description": ERRORS[code], "content": {"application/json": {"schema": error}}}
    return op


def _ok(answers: str, schema: str | None, error: dict) -> dict:
    body = s.ref(schema) if schema else {"type": "object"}
    if answers == "text":
        return {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}}
    if answers == "empty":
        return {"description": "OK, no body"}
    content = {"application/json": {"schema": body}}
    if answers == "ndjson":
        content["application/x-ndjson"] = {"schema": {"anyOf": [body, error],
                                                      "description": "with stream (the default): each line, a JSON object"}}
    if answers == "sse":
        chunk = s.ref(SSE_CHUNKS[schema])
        content["text/event-stream"] = {"schema": {"anyOf": [chunk, error],
                                                   "description": "with stream: true, each `data: {json}` event; then `data: [DONE]`"}}
    return {"description": "OK", "content": content}


@routes.get("/api/openapi.json")
@routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    return web.json_response(document())
