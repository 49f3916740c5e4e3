"""Test-wide guard: every Plan any test serialises (``Plan.to_dict``, hence ``to_json`` and ``--json``
output produced in-process) must validate against the shipped Plan JSON Schema."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _plans_follow_the_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    from planner.plans import Plan, schema_errors

    original = Plan.to_dict

    def checked(self: Plan) -> dict:
        document = original(self)
        errors = schema_errors(document)
        assert not errors, f"an emitted plan does not follow the schema: {errors}"
        return document

    monkeypatch.setattr(Plan, "to_dict", checked)
