"""The daemon's OpenAPI document (issue 14): valid OpenAPI 3.1, served at /api/openapi.json and
/openapi.json, and describing exactly the routes the router serves (a route added without a
description fails here). The fuzz (test_fuzz.py) checks the answers against it."""

from __future__ import annotations

from openapi_spec_validator import validate

from api_helpers import post
from mlxspec.options import GenerateOptions
from mlxspec.server import Settings, make_app
from mlxspec.server.openapi import document
from mlxspec.store import Store


def test_the_document_is_valid_openapi():
    validate(document())


def test_every_route_is_described_and_every_description_is_a_route(tmp_path):
    app = make_app(Store(tmp_path), Settings())
    served = {(r.method.lower(), r.resource.canonical) for r in app.router.routes()}
    described = {(method, path) for path, operations in document()["paths"].items() for method in operations}
    assert served - described == set(), "routes without a description"
    assert described - served == set(), "descriptions of routes the daemon does not serve"


def test_options_schema_lists_every_option_the_engine_takes():
    options = document()["components"]["schemas"]["Options"]
    assert set(options["properties"]) == set(GenerateOptions.names()) and options["additionalProperties"] is False


def test_served_at_both_addresses(daemon):
    first = post(daemon.url + "/api/openapi.json", None, method="GET")
    second = post(daemon.url + "/openapi.json", None, method="GET")
    assert first == second == (200, first[1]) and set(first[1]["paths"]) >= {"/api/chat", "/v1/chat/completions"}
