"""Prompt templates: how a question and the multi-turn feedback are laid out as text for the model.

The default is the R1-Zero template (DeepSeek-R1 paper, table 1): the model answers with
``<think>…</think><answer>…</answer>``. ``"compact"`` drops the instructions (for the built-in tiny model,
which learns the format from the cold-start data instead). Any string with a ``{prompt}`` field is a template
too. When the tokenizer has a chat template and ``use_chat_template`` is on, the instructions become the
system message and the question the user message, rendered by the tokenizer's own chat template.

A **conversation** (a conversational dataset's ``[{"role": "system" | "user" | "assistant", "content": ...}]``, TRL's
format) is the whole prompt, as in TRL: the template is not applied around it. With a chat template (and
``use_chat_template`` not ``False``) it is rendered by ``tokenizer.apply_chat_template(messages,
add_generation_prompt=True)``; without one, in the templates' plain layout (:func:`plain_conversation`): a system
message's text on its own line, then ``User: ...`` / ``Assistant: ...`` lines, ending with ``Assistant: `` (so
``[system: the R1-Zero instructions, user: q]`` reads exactly as the ``"r1zero"`` template around ``q``, and
``[user: q]`` as ``"compact"``).

**Tools** (``R1ZeroEnv(tools=...)``, :mod:`grpo_gym.tools`). With a chat template, the schemas go to
``apply_chat_template(..., tools=schemas)`` (the template shows them, usually in the system message; a template
that ignores ``tools`` is refused) and each result is a ``{"role": "tool", "name": ..., "content": ...}``
message. Without one, a plain-text block comes before the template's text (or before a conversation): for
``"r1zero"`` and your own templates :data:`TOOLS_INSTRUCTIONS` and one JSON schema per line; for ``"compact"`` one
line, ``Tools: calculator(expression)`` (the tiny model learns the call format from the cold start). After a tool
turn the results follow as one ``"\nTool: <result>"`` line per call, then the ``"\nAssistant: "`` cue
(:data:`TOOL_RESULT_FORMAT`).
"""

from __future__ import annotations

import json
from typing import Any

from grpo_gym.validation import ArgumentError, check_choice

R1ZERO_INSTRUCTIONS = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with the "
    "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> "
    "tags, respectively, i.e., <think> reasoning process here </think><answer> answer here </answer>."
)
TEMPLATES = {
    "r1zero": R1ZERO_INSTRUCTIONS + "\nUser: {prompt}\nAssistant: ",
    "compact": "User: {prompt}\nAssistant: ",
}
FEEDBACK_FORMAT = "\nUser: {feedback}\nAssistant: "
ROLE_LABELS = {"user": "User", "assistant": "Assistant"}
"""How the plain layout labels a message's role (other roles: the role's name, capitalised)."""
Messages = list[dict[str, str]]
TOOLS_INSTRUCTIONS = (
    'To call a tool, write <tool_call>{"name": <tool name>, "arguments": {<arguments>}}</tool_call>; its result '
    'comes back after "Tool:". The tools (JSON schemas):\n'
)
TOOL_RESULT_FORMAT = "\nTool: {result}"
TURN_CUE = "\nAssistant: "
_PLACEHOLDER = "\x00"  # stands for the question / feedback message when the template is rendered once
_COMPLETION = "\x01"  # stands for the model's completion in the rendered chat


class PromptFormatter:
    """Renders the first prompt and the feedback turns of an episode as text.

    :param template: ``"r1zero"``, ``"compact"`` or a format string with a ``{prompt}`` field
    :param tokenizer: the env's tokenizer (used only for its chat template)
    :param use_chat_template: ``"auto"`` (when the tokenizer has one), ``True`` or ``False``
    :param tools: the JSON schemas of the env's tools (see the module docstring), or ``None``
    """

    def __init__(
        self,
        template: str,
        tokenizer: Any,
        use_chat_template: bool | str = "auto",
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        wanted = f"template must be one of {sorted(TEMPLATES)} or a string with a '{{prompt}}' field"
        if not isinstance(template, str):
            raise ArgumentError(f"{wanted}, got {type(template).__name__}")
        template = TEMPLATES.get(template, template)
        if "{prompt}" not in template:
            raise ArgumentError(f"{wanted}, got {template!r}")
        try:
            template.format(prompt="")
        except (KeyError, IndexError, ValueError) as error:
            raise ArgumentError(
                f"{wanted} and no other field ({type(error).__name__}: {error}); write literal braces as {{{{ }}}}"
            ) from None
        use_chat_template = check_choice("use_chat_template", use_chat_template, ("auto", True, False))
        has_chat = getattr(tokenizer, "chat_template", None) is not None
        if use_chat_template is True and not has_chat:
            raise ValueError("use_chat_template=True but the tokenizer has no chat template; pass 'auto' or False")
        self.template = template
        self.tokenizer = tokenizer
        self.chat = has_chat if use_chat_template == "auto" else bool(use_chat_template)
        self._system = R1ZERO_INSTRUCTIONS if template == TEMPLATES["r1zero"] else None
        self.tools = list(tools or [])
        self._tools_block = tools_block(self.tools, compact=template == TEMPLATES["compact"]) if self.tools else ""
        if self.chat and self.tools:
            self._check_chat_shows_tools()
        # The text around the question and around a feedback message, rendered once: the hot path (one
        # prompt per env reset) then only concatenates, and the env encodes the constant parts once.
        self.prompt_affixes = self._split(self._prompt_text(_PLACEHOLDER))
        self.feedback_affixes = self._split(self._feedback_text(_PLACEHOLDER))

    @property
    def system(self) -> str | None:
        """The system message of a prompt rendered by the chat template (the R1-Zero instructions), or ``None``."""
        return self._system if self.chat else None

    def _messages(self, question: str) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self._system}] if self._system else []
        return [*system, {"role": "user", "content": question}]

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool, tools: bool = True) -> str:
        extra = {"tools": self.tools} if self.tools and tools else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **extra
        )

    def _check_chat_shows_tools(self) -> None:
        messages = self._messages("?")
        if self._render(messages, True) == self._render(messages, True, tools=False):
            raise ArgumentError(
                "the tokenizer's chat template does not show tools (apply_chat_template(..., tools=...) renders "
                "nothing of them): use a chat template with tool support, or use_chat_template=False for the "
                "plain-text tools block of grpo_gym.templates"
            )

    def _prompt_text(self, question: str) -> str:
        if not self.chat:
            return self._tools_block + self.template.format(prompt=question)
        return self._render(self._messages(question), generation_prompt=True)

    def _feedback_text(self, message: str) -> str:
        if not self.chat:
            return FEEDBACK_FORMAT.format(feedback=message)
        # Render a conversation with a placeholder completion and keep only what follows it: the chat
        # template's end-of-turn marker, the user's feedback and the new generation prompt.
        before = [*self._messages("?"), {"role": "assistant", "content": _COMPLETION}]
        text = self._render([*before, {"role": "user", "content": message}], generation_prompt=True)
        return text[text.rfind(_COMPLETION) + 1 :]

    @staticmethod
    def _split(text: str) -> tuple[str, str]:
        before, _, after = text.partition(_PLACEHOLDER)
        return before, after

    def prompt(self, question: str | Messages) -> str:
        """The text of the first turn, ending where the model's completion starts: the template around a question,
        or a conversation (a list of messages) rendered by the chat template or in the plain layout."""
        if not isinstance(question, str):
            if self.chat:
                return self._render(question, generation_prompt=True)
            return self._tools_block + plain_conversation(question)
        before, after = self.prompt_affixes
        return before + question + after

    def feedback(self, message: str) -> str:
        """The text appended after a completion: the end of the model's turn, the feedback, the next cue."""
        before, after = self.feedback_affixes
        return before + message + after

    def tool_results(self, names: list[str | None], results: list[str]) -> str:
        """The text appended after a tool turn: the end of the model's turn, one tool message per call (``names``:
        the tools called, ``results``: what each returned, or its error), the next cue."""
        if not self.chat:
            return "".join(TOOL_RESULT_FORMAT.format(result=result) for result in results) + TURN_CUE
        before = [*self._messages("?"), {"role": "assistant", "content": _COMPLETION}]
        messages = [
            {"role": "tool", "name": name or "", "content": text} for name, text in zip(names, results, strict=True)
        ]
        text = self._render([*before, *messages], generation_prompt=True)
        return text[text.rfind(_COMPLETION) + 1 :]


def plain_conversation(messages: Messages) -> str:
    """A conversation in the templates' plain layout (see the module docstring), ending with ``"Assistant: "``."""
    lines = []
    for message in messages:
        role, content = message["role"], message["content"]
        lines.append(content if role == "system" else f"{ROLE_LABELS.get(role, role.capitalize())}: {content}")
    return "\n".join(lines) + "\nAssistant: "


def tools_block(schemas: list[dict[str, Any]], compact: bool) -> str:
    """The plain-text block that shows the tools before a template without a chat template: one line of
    signatures (``compact``), or :data:`TOOLS_INSTRUCTIONS` and one JSON schema per line."""
    functions = [schema["function"] for schema in schemas]
    if compact:
        signatures = [f"{f['name']}({', '.join(f['parameters'].get('properties', {}))})" for f in functions]
        return f"Tools: {', '.join(signatures)}\n"
    return TOOLS_INSTRUCTIONS + "".join(json.dumps(f, ensure_ascii=False) + "\n" for f in functions)
