"""Each concurrent call of one request (n > 1 choices) goes out under its own Serve request id."""

from ray.serve import context as serve_context

from deployments.serve_request_ids import as_own_request


def test_a_call_gets_a_fresh_id_and_the_request_keeps_its_own() -> None:
    serve_context._set_request_context(route="/v1/completions", request_id="client-id", _internal_request_id="parent")

    def seen() -> tuple[str, str, str]:
        ctx = serve_context._get_serve_request_context()
        return ctx._internal_request_id, ctx.request_id, ctx.route

    first, second = as_own_request(seen), as_own_request(seen)
    assert first[0] not in ("parent", second[0]) and second[0] != "parent"
    assert first[1:] == second[1:] == ("client-id", "/v1/completions")  # only the internal id changes
    assert seen() == ("parent", "client-id", "/v1/completions")
