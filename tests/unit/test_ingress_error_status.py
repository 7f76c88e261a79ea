"""What HTTP status a client gets for a runbus error: the input's fault is a 4xx (an OpenAI
client raises its BadRequestError for a prompt longer than the model's context, as with
OpenAI itself), the runtime's is a 5xx."""

import msgspec
import pytest

from runbus.messages import ErrorInfo
from runbus_ingress.errors import error_response


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("context_too_long", 400, "invalid_request_error"),
        ("unsupported_request", 400, "invalid_request_error"),
        ("bad_request", 400, "invalid_request_error"),
        ("message_too_large", 413, "invalid_request_error"),
        ("budget_exceeded", 429, "rate_limit_error"),
        ("model_unavailable", 503, "server_error"),
        ("internal", 500, "server_error"),
    ],
)
def test_an_error_code_maps_to_the_status_a_client_expects(
    code: str, status: int, kind: str
) -> None:
    response = error_response(ErrorInfo(code=code, message="m"), openai=True)

    assert response.status == status
    assert response.body is not None
    body = msgspec.json.decode(bytes(response.body))  # type: ignore[arg-type]
    assert body["error"]["code"] == code
    assert body["error"]["type"] == kind
