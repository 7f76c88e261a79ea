"""Settings from `RUNBUS_*` variables: defaults, conversion, and errors that name the variable."""

import pytest

from runbus.settings import Settings, SettingsError, load_settings


def test_no_runbus_variables_give_the_documented_defaults() -> None:
    settings = load_settings({"PATH": "/usr/bin", "HOME": "/root"})

    assert settings == Settings()
    assert settings.nats_url is None
    assert settings.data_dir == ".runbus"
    assert settings.token == "dev-alice"
    assert settings.run_concurrency == 64
    # A production service serves no example tools, agents or models unless told to.
    assert settings.tool_modules == ""
    assert settings.agents_dir is None
    assert settings.model_backends == ""
    # An open connection outlives the removal of its token by at most this many seconds.
    assert settings.client_credential_ttl == 300


def test_variables_are_converted_to_their_field_types() -> None:
    settings = load_settings(
        {
            "RUNBUS_NATS_URL": "nats://10.0.0.5:4222",
            "RUNBUS_DATA_DIR": "/var/lib/runbus",
            "RUNBUS_LOG_LEVEL": "debug",
            "RUNBUS_RUN_CONCURRENCY": "8",
            "RUNBUS_RUN_TIMEOUT": "2.5",
            "RUNBUS_REQUEST_TIMEOUT": "1",
            "RUNBUS_CLIENT_CREDENTIAL_TTL": "60",
            "RUNBUS_RUN_ACK_WAIT": "10",
        }
    )
    assert settings.run_ack_wait == 10

    assert settings.nats_url == "nats://10.0.0.5:4222"
    assert str(settings.data_path) == "/var/lib/runbus"
    assert settings.log_level == "debug"
    assert settings.run_concurrency == 8
    assert settings.run_timeout == 2.5
    assert settings.request_timeout == 1.0
    assert settings.client_credential_ttl == 60


@pytest.mark.parametrize("variable", ["RUNBUS_NATS_URI", "RUNBUS_DATA_PATH", "RUNBUS_"])
def test_an_unknown_runbus_variable_stops_start_naming_it(variable: str) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings({variable: "x", "RUNBUS_TOKEN": "dev-bob"})

    assert raised.value.variable == variable
    assert variable in str(raised.value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RUNBUS_RUN_CONCURRENCY", "many"),
        ("RUNBUS_RUN_CONCURRENCY", "0"),
        ("RUNBUS_RUN_CONCURRENCY", "10001"),
        ("RUNBUS_RUN_TIMEOUT", "-1"),
        ("RUNBUS_REQUEST_TIMEOUT", "0"),
        ("RUNBUS_LOG_LEVEL", "loud"),
        ("RUNBUS_LOG_FORMAT", "xml"),
        ("RUNBUS_CLIENT_CREDENTIAL_TTL", "0"),
        ("RUNBUS_CLIENT_CREDENTIAL_TTL", "-300"),
        ("RUNBUS_CLIENT_CREDENTIAL_TTL", "5m"),
        ("RUNBUS_RUN_ACK_WAIT", "1"),
        ("RUNBUS_RUN_ACK_WAIT", "7200"),
    ],
)
def test_a_bad_value_stops_start_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings({variable: value, "RUNBUS_TOKEN": "dev-bob"})

    assert raised.value.variable == variable
    assert str(raised.value).startswith(f"{variable}: ")


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("RUNBUS_HTTP_PORT", "abc", "RUNBUS_HTTP_PORT: 'abc' is not a whole number"),
        ("RUNBUS_HTTP_PORT", "70000", "RUNBUS_HTTP_PORT: '70000' must be a whole number <= 65535"),
        ("RUNBUS_RUN_TIMEOUT", "-1", "RUNBUS_RUN_TIMEOUT: '-1' must be a number > 0"),
        ("RUNBUS_LOG_FORMAT", "xml", "RUNBUS_LOG_FORMAT: 'xml' is not one of auto, json, console"),
        ("RUNBUS_OPEN_BUS", "maybe", "RUNBUS_OPEN_BUS: 'maybe' is not true or false"),
    ],
)
def test_a_bad_value_is_told_in_runbus_words_with_the_value_given(
    variable: str, value: str, said: str
) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings({variable: value})

    assert str(raised.value) == said
    assert "$." not in str(raised.value)
