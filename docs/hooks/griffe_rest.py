"""Griffe extensions for the API reference: our SB3-style reST docstrings read well as mkdocstrings renders them.

- :class:`Signatures`: ``GRPO``'s and ``LMPPO``'s ``__init__`` are wrapped by
  ``algorithms.common.arguments.Arguments.constructor``, which gives them their argument table's signature through
  ``__signature__`` (what ``inspect.signature`` and ``help()`` read). Griffe unwraps functions before reading their
  signature, so it would show the wrapper's ``(self, policy, env, _init_setup_model=True, **kwargs)``; this puts the
  declared parameters back.
- :class:`ReSTRoles`: the ``:param x:`` fields are read by the "sphinx" docstring style, but the text is rendered
  as Markdown, where reST's roles (``:class:`~a.b.C```, ``:mod:`a.b```, ``:func:``, ``:meth:``, ...) and ``::``
  literal markers would show as they are written. Each role becomes a code span of its target (the last part with
  ``~``, as Sphinx shows it), and a paragraph's closing ``::`` a colon.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import griffe

KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: griffe.ParameterKind.positional_only,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: griffe.ParameterKind.positional_or_keyword,
    inspect.Parameter.VAR_POSITIONAL: griffe.ParameterKind.var_positional,
    inspect.Parameter.KEYWORD_ONLY: griffe.ParameterKind.keyword_only,
    inspect.Parameter.VAR_KEYWORD: griffe.ParameterKind.var_keyword,
}
ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|attr|data|exc|obj|const):`(~?)([^`<]+?)(?:\s*<([^>]+)>)?`")
LITERAL = re.compile(r"(\S)::[ \t]*$", re.M)


def _text(value: Any) -> str | None:
    if value is inspect.Parameter.empty:
        return None
    return value if isinstance(value, str) else getattr(value, "__name__", repr(value))


def _role(match: re.Match[str]) -> str:
    """``:class:`~a.b.C``` -> ```C```, ``:mod:`a.b``` -> ```a.b```, ``:func:`text <target>``` -> ```text```."""
    shown = match.group(2).strip()
    return f"`{shown.split('.')[-1] if match.group(1) else shown}`"


def markdown(text: str) -> str:
    """A reST docstring's roles and literal markers in Markdown."""
    return LITERAL.sub(r"\1:", ROLE.sub(_role, text))


class Signatures(griffe.Extension):
    """Read a wrapped function's ``__signature__`` when it declares one."""

    def on_function_instance(self, *, node: Any, func: griffe.Function, agent: Any, **kwargs: Any) -> None:
        """Replace the unwrapped function's parameters by the ones its wrapper declares."""
        owner = getattr(getattr(node, "parent", None), "obj", None)
        declared = getattr(getattr(owner, func.name, None), "__signature__", None)
        if not isinstance(declared, inspect.Signature):
            return
        func.parameters = griffe.Parameters(
            *[
                griffe.Parameter(
                    p.name,
                    annotation=_text(p.annotation),
                    kind=KINDS[p.kind],
                    default=None if p.default is inspect.Parameter.empty else repr(p.default),
                )
                for p in declared.parameters.values()
            ]
        )


class ReSTRoles(griffe.Extension):
    """Rewrite reST roles and literal markers of every docstring as Markdown."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring, once, when it has one."""
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
