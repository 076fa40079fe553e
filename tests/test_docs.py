"""The docs page of detected calls is generated from the rules table, never edited by hand."""

from __future__ import annotations

from pathlib import Path

from aiocop import _docs

ROOT = Path(__file__).resolve().parent.parent


def test_detected_calls_page_is_up_to_date() -> None:
    page = ROOT / "docs" / "reference" / "detected-calls.md"
    assert page.read_text(encoding="utf-8") == _docs.render(), (
        "regenerate with: python -m aiocop._docs > docs/reference/detected-calls.md"
    )


def test_every_detected_event_is_on_the_page() -> None:
    import aiocop

    page = _docs.render()
    for event in aiocop.get_blocking_events_dict():
        assert f"| `{event}` |" in page


def test_changelog_copy_in_docs_is_current() -> None:
    assert (ROOT / "docs" / "changelog.md").read_text(encoding="utf-8") == (ROOT / "CHANGELOG.md").read_text(
        encoding="utf-8"
    )
