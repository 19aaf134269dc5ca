"""Fixtures the test modules share."""

from collections.abc import Iterator, Sequence

import pytest


@pytest.fixture
def scripted_input(monkeypatch):
    """feed(lines): input() returns the lines in order, then raises EOFError (as Ctrl-D would); feed returns
    the iterator, so a test can see which lines were never read."""

    def feed(lines: Sequence[str]) -> Iterator[str]:
        script = iter(lines)

        def fake_input(prompt: str = "") -> str:
            try:
                return next(script)
            except StopIteration:
                raise EOFError from None

        monkeypatch.setattr("builtins.input", fake_input)
        return script

    return feed


@pytest.fixture(autouse=True)
def _speculation_memory_in_tmp(monkeypatch, tmp_path_factory):
    """Keeps the speculation cost files the command line saves (``Model.remember_speculation``) out of the
    user's cache: under the session's temporary folder instead."""
    import regolith.model

    root = tmp_path_factory.getbasetemp() / "regolith-cache"
    monkeypatch.setattr(regolith.model, "cache_root", lambda: root)
