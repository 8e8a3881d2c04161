"""Prompt templates (`manifest.template`): `{column}` placeholders filled from a row's values, braces
doubled for a literal one, every fault of a template reported at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagebatch.manifest import load_manifest, render_prompt
from imagebatch.manifest.template import TemplateError


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (
            "Studio photo of {product_name} in {colour} on white",
            "Studio photo of mug in cobalt blue on white",
        ),
        ("no placeholders", "no placeholders"),
        ("{{literal}}", "{literal}"),
        ("{{{colour}}}", "{cobalt blue}"),
        ("}}{{", "}{"),
        ("{ colour }", "cobalt blue"),
        ("{count} x {flag} x {none}", "3 x true x "),
        ("{colour}{colour}", "cobalt bluecobalt blue"),
        ("{brace}", "{x}"),  # values are not templates themselves
        ("100% {colour} %s %(colour)s %%", "100% cobalt blue %s %(colour)s %%"),  # no % is a format's
        ("{percent}{colour}", "50% %s %%cobalt blue"),
        ("{{}}", "{}"),
        ("{colour} x {count}", "cobalt blue x 3"),  # text and a number
    ],
)
def test_render_prompt(template: str, expected: str) -> None:
    values = {
        "product_name": "mug",
        "colour": "cobalt blue",
        "count": 3,
        "flag": True,
        "none": None,
        "brace": "{x}",
        "percent": "50% %s %%",
    }
    assert render_prompt(template, values) == expected


def test_render_prompt_reports_every_fault() -> None:
    with pytest.raises(TemplateError) as info:
        render_prompt("{a} {b} } {}", {"c": "1"})
    assert [m for m, _ in info.value.issues] == [
        "placeholder {a} names no column of this row",
        "placeholder {b} names no column of this row",
        "unmatched '}' in the prompt",
        "empty placeholder {} in the prompt",
    ]


def test_render_prompt_names_a_missing_column_and_a_list_in_a_template_with_no_fault() -> None:
    with pytest.raises(TemplateError) as info:
        render_prompt("{colur} and {c}", {"c": "1", "colour": "red"})
    missing = ("placeholder {colur} names no column of this row", "did you mean {colour}?")
    assert info.value.issues == [missing]
    with pytest.raises(TemplateError) as info:
        render_prompt("{c} and {tags}", {"c": "1", "tags": ["a"]})
    assert info.value.issues == [("placeholder {tags} names a list or object, not a value", None)]


def test_template_uses_defaults_and_metadata(tmp_path: Path) -> None:
    doc = {
        "defaults": {"prompt": "Photo of {product} for {campaign}", "campaign": "spring"},
        "jobs": [{"id": "a", "product": "a mug"}, {"id": "b", "product": "a bowl", "campaign": "autumn"}],
    }
    (tmp_path / "m.json").write_text(json.dumps(doc))
    a, b = load_manifest(tmp_path / "m.json").jobs
    assert (a.prompt, b.prompt) == ("Photo of a mug for spring", "Photo of a bowl for autumn")
    assert a.metadata == {"campaign": "spring", "product": "a mug"}
