"""Test-wide guard: every Plan any test serialises (``Plan.to_dict``, hence ``to_json`` and ``--json``
output produced in-process) must validate against the shipped Plan JSON Schema, by jsonschema and by the
planner's own validator."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _plans_follow_the_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    import jsonschema

    from planner.plans import Plan, schema, schema_errors

    original = Plan.to_dict
    strict = jsonschema.Draft202012Validator(schema())

    def checked(self: Plan) -> dict:
        document = original(self)
        # the reference validator and the planner's own (which also checks what the schema cannot say)
        errors = [error.message for error in strict.iter_errors(document)] + schema_errors(document)
        assert not errors, f"an emitted plan does not follow the schema: {errors}"
        return document

    monkeypatch.setattr(Plan, "to_dict", checked)
