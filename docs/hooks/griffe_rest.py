"""Griffe extensions for the API reference: our SB3-style reST docstrings read well as mkdocstrings renders them, and
the algorithms show the signature their argument table gives them.

- :class:`ReSTRoles`: the ``:param x:`` fields are read by the "sphinx" docstring style, but the text is rendered
  as Markdown, where reST's roles (``:class:`~a.b.C```, ``:mod:`a.b```, ``:func:``, ``:meth:``, ...) and ``::``
  literal markers would show as they are written. Each role becomes a code span of its target (the last part with
  ``~``, as Sphinx shows it), and a paragraph's closing ``::`` a colon.
- :class:`DeclaredSignatures`: an algorithm's ``__init__`` is written ``(self, policy, env, **kwargs)`` and takes
  its signature from its argument table at import (``__signature__``); an inspected class's ``__init__`` gets those
  parameters, so its ``:param:`` lines match them.
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


class DeclaredSignatures(griffe.Extension):
    """Give an inspected class's ``__init__`` the parameters of its runtime ``__signature__``, where it has one."""

    def on_class_members(self, *, node: Any, cls: griffe.Class, **kwargs: Any) -> None:
        """Replace the ``__init__`` parameters of ``cls`` with its declared signature's."""
        import inspect

        init = getattr(getattr(node, "obj", None), "__init__", None)
        declared = getattr(init, "__signature__", None)
        member = cls.members.get("__init__")
        if declared is None or member is None or not isinstance(member, griffe.Function):
            return
        kind = griffe.ParameterKind.positional_or_keyword
        member.parameters = griffe.Parameters(
            *(
                griffe.Parameter(
                    name,
                    annotation=None if parameter.annotation is inspect.Parameter.empty else str(parameter.annotation),
                    kind=kind,
                    default=None if parameter.default is inspect.Parameter.empty else repr(parameter.default),
                )
                for name, parameter in declared.parameters.items()
            )
        )
