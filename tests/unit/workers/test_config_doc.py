from pathlib import Path

from workers.config_doc import render
from workers.settings import Settings

PAGE = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_configuration_page_is_generated_from_the_settings_model() -> None:
    assert PAGE.read_text() == render(), "docs/configuration.md is stale: python -m workers.config_doc > it"


def test_every_setting_is_documented() -> None:
    page = PAGE.read_text()
    for name, info in Settings.model_fields.items():
        assert f"`{name}" in page, name
        assert info.description, f"setting {name} has no description"
