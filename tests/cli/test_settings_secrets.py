"""The secret settings are declared once: a `Settings` field typed `SecretStr` is masked in logs
(`Settings.secrets`), stripped of the trailing newline a Secret made from a file keeps, and refused
when it holds a character an HTTP header cannot carry.

Before, the secrets were listed twice (the validators' tuple and `secrets()`), so a new secret
setting had to be added to both; one left out of `secrets()` printed in clear in the log.
"""

from __future__ import annotations

import pytest
from pydantic import SecretStr, ValidationError

from triage.errors import ConfigError
from triage.settings import Settings, load_settings

#: a value each secret setting accepts (the database URL must be a PostgreSQL one)
SAMPLE = {"triage_relay_database_url": "postgresql://relay:pw-7f3k@db:5432/relay"}
KNOWN = {
    "langfuse_secret_key",
    "github_token",
    "openai_api_key",
    "triage_mcp_token",
    "triage_relay_token",
    "triage_relay_signing_key",
    "triage_relay_database_url",
}


def sample(name: str) -> str:
    return SAMPLE.get(name, f"sk-{name}-9q2")


def test_the_secret_settings_are_the_fields_typed_secretstr() -> None:
    assert set(Settings.secret_fields()) == KNOWN
    assert "langfuse_public_key" not in Settings.secret_fields()  # a key, but the public half


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_every_secret_setting_is_stripped_and_masked(name: str) -> None:
    settings = Settings.model_validate({name: sample(name) + "\n"})  # as `kubectl create secret --from-file` leaves it
    value = getattr(settings, name)
    assert isinstance(value, SecretStr) and value.get_secret_value() == sample(name)
    assert sample(name) in settings.secrets()
    assert sample(name) not in repr(settings) and sample(name) not in str(settings.model_dump())


@pytest.mark.parametrize("name", sorted(KNOWN - {"triage_relay_database_url"}))
def test_every_secret_setting_that_travels_in_a_header_is_refused_with_a_character_no_header_carries(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name.upper(), "sk-with a space")
    with pytest.raises(ConfigError, match="HTTP header") as caught:
        load_settings()
    assert name.upper() in str(caught.value) and "sk-with a space" not in str(caught.value)  # never echoed


def test_the_database_url_is_checked_by_its_own_rule_and_its_password_masked_alone() -> None:
    settings = Settings.model_validate({"triage_relay_database_url": SAMPLE["triage_relay_database_url"]})
    assert "pw-7f3k" in settings.secrets()
    with pytest.raises(ValidationError, match="postgresql://"):
        Settings.model_validate({"triage_relay_database_url": "mysql://relay:pw@db/relay"})


def test_the_public_key_is_stripped_and_checked_like_a_key_and_masked_only_with_its_secret() -> None:
    settings = Settings.model_validate({"langfuse_public_key": "pk-lf-1\n", "langfuse_secret_key": "sk-lf-1"})
    assert settings.langfuse_public_key == "pk-lf-1"
    assert "pk-lf-1" not in settings.secrets() and "pk-lf-1:sk-lf-1" in settings.secrets()
    with pytest.raises(ValidationError, match="HTTP header"):
        Settings.model_validate({"langfuse_public_key": "pk lf"})


class WithANewSecret(Settings):
    """A secret setting added the one way there is: a field typed `SecretStr`."""

    triage_new_token: SecretStr | None = None


def test_a_secret_setting_added_in_a_subclass_is_masked_and_validated_with_no_other_edit() -> None:
    settings = WithANewSecret.model_validate({"triage_new_token": "tok-new-31\n"})
    assert settings.triage_new_token is not None
    assert settings.triage_new_token.get_secret_value() == "tok-new-31"
    assert "tok-new-31" in settings.secrets()
    with pytest.raises(ValidationError, match="HTTP header"):
        WithANewSecret.model_validate({"triage_new_token": "tok\u00e9"})
    assert "triage_new_token" in WithANewSecret.secret_fields()
