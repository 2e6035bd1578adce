"""The ``notify`` settings section: defaults, validation, and the secret staying secret."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workers.settings import NotifySettings, Settings


def test_defaults_send_what_needs_a_person() -> None:
    s = NotifySettings()
    assert s.webhook_url is None and s.kinds == ("incident", "approval_needed", "gave_up", "scheduler_auth")


def test_from_environment_with_secret_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REBOUND_NOTIFY__WEBHOOK_URL", "https://hooks.example/services/T/B/secret")
    monkeypatch.setenv("REBOUND_NOTIFY__KINDS", '["gave_up", "resumed"]')
    s = Settings()
    assert s.notify.webhook_url is not None
    assert s.notify.webhook_url.get_secret_value().endswith("/secret")
    assert s.notify.kinds == ("gave_up", "resumed")
    assert "secret" not in repr(s) and "secret" not in str(s.model_dump())


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kinds": ["incident", "pager"]}, "unknown pager"),
        ({"webhook_url": "hooks.example/x"}, "notify.webhook_url must be an http"),
        ({"ui_base_url": "localhost:8233"}, "notify.ui_base_url must be an http"),
        ({"timeout_s": 0}, "greater than 0"),
        ({"max_attempts": 9}, "less than or equal to 5"),
    ],
)
def test_bad_values_are_clear_errors(values: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        NotifySettings.model_validate(values)
