"""A Griffe extension for the API reference: our SB3-style reST docstrings read well as mkdocstrings renders them.

- :class:`ReSTRoles`: the ``:param x:`` fields are read by the "sphinx" docstring style, but the text is rendered
  as Markdown, where reST's roles (``:class:`~a.b.C```, ``:mod:`a.b```, ``:func:``, ``:meth:``, ...) and ``::``
  literal markers would show as they are written. Each role becomes a code span of its target (the last part with
  ``~``, as Sphinx shows it), and a paragraph's closing ``::`` a colon.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|attr|data|exc|obj|const):`(~?)([^`<]+?)(?:\s*<([^>]+)>)?`")
LITERAL = re.compile(r"(\S)::[ \t]*$", re.M)


def _role(match: re.Match[str]) -> str:
    """``:class:`~a.b.C``` -> ```C```, ``:mod:`a.b``` -> ```a.b```, ``:func:`text <target>``` -> ```text```."""
    shown = match.group(2).strip()
    return f"`{shown.split('.')[-1] if match.group(1) else shown}`"


def markdown(text: str) -> str:
    """A reST docstring's roles and literal markers in Markdown."""
    return LITERAL.sub(r"\1:", ROLE.sub(_role, text))


class ReSTRoles(griffe.Extension):
    """Rewrite reST roles and literal markers of every docstring as Markdown."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring, once, when it has one."""
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
