"""The one-line error helpers of mtbert/errors.py."""
from __future__ import annotations

from mtbert.errors import first_line


def test_first_line_of_an_error_its_text_or_its_type():
    assert first_line(OSError("\n  cannot open x. See the docs.\nmore lines\n")) == "cannot open x. See the docs."
    assert first_line(OSError("cannot open x. See the docs."), sentence=True) == "cannot open x"
    assert first_line(ValueError("abcdef"), limit=3) == "abc"
    assert first_line(KeyError()) == "KeyError"  # no message: the type names it
    assert first_line(ValueError("  \n ")) == "ValueError"
    assert first_line("RuntimeError: boom\ntraceback") == "RuntimeError: boom"  # a text as well
    assert first_line("") == ""
