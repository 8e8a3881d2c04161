"""Helpers shared by the test packages (importable as `helpers`: `tests/` is on the path through its
conftest)."""
