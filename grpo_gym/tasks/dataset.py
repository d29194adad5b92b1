"""The ``dataset`` task: problems from your own data, with the column names you use.

``task="dataset"`` with ``task_kwargs={"data": ..., "prompt": "question", "answer": "answer"}``. ``data`` (and
``eval_data``, the held-out split) is any of:

- a Hugging Face ``datasets.Dataset`` (one split: ``ds["train"]``, not a ``DatasetDict``);
- a list of dicts (one per row);
- the path of a ``.jsonl`` file (one JSON object per line), a ``.json`` file (an array of objects, or JSON lines
  as ``Dataset.to_json`` writes them), a ``.csv`` file (a header row; UTF-8) or a ``.parquet`` file (needs
  ``pyarrow``: ``pip install grpo-gym[datasets]``).

Columns: ``prompt`` and ``answer`` (a string or a number) are required. The prompt is a non-empty string (the
question, laid out by the env's template), or a conversation in TRL's conversational format: a list of
``{"role": "system" | "user" | "assistant", "content": "..."}`` messages, which is the whole prompt (rendered by
the tokenizer's chat template, or without one in the plain ``User: ... / Assistant:`` layout; see
:mod:`grpo_gym.templates`); all rows take the same form.
``solution`` (gold reasoning for the cold start) and ``difficulty`` (a number in [0.1, 1.0], every row) are
optional. Every column of a row — these and all the others — reaches reward functions by its own name, as TRL
passes a dataset's columns (:meth:`RowTask.reward_columns`); values are kept as plain JSON data (numbers, strings,
lists, dicts; numpy values as Python ones, anything else as its ``str``). Sampling, verifying and the held-out split
are :mod:`grpo_gym.tasks.rows`'. Nothing here imports ``datasets``; a ``Dataset`` is read by iterating its rows.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from grpo_gym.tasks.base import check_difficulty
from grpo_gym.tasks.rows import Row, RowTask, answer_as_text, checked_solution, checked_text, plain
from grpo_gym.validation import MAX_LINE_BYTES, ArgumentError, check_int, read_lines

#: the roles a conversational prompt's messages may have (TRL's conversational format, text only)
PROMPT_ROLES = ("system", "user", "assistant", "tool")
DATA_FORMS = "a datasets.Dataset, a list of dicts, or the path of a .jsonl, .json, .csv or .parquet file"
SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def _is_hf(data: Any, *names: str) -> bool:
    """Whether ``data`` is one of the ``datasets`` library's classes ``names`` (checked without importing it)."""
    return type(data).__module__.split(".")[0] == "datasets" and type(data).__name__ in names


def _json_records(where: str, max_line_bytes: int) -> Iterator[tuple[int, Any]]:
    """A ``.json`` file: an array of objects, or JSON lines (what ``Dataset.to_json`` writes)."""
    with open(where, encoding="utf-8-sig") as handle:
        text = handle.read()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        if error.msg != "Extra data":
            raise ValueError(f"{where}: not valid JSON ({error.msg} at line {error.lineno})") from None
        yield from _jsonl_records(where, max_line_bytes)
        return
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply to read; flatten the rows") from None
    except ValueError:  # a number past Python's 4300 digits
        raise ValueError(f"{where}: not valid JSON (a number longer than 4300 digits)") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise ValueError(f"{where}: a .json data file holds an array of objects (one per row)")
    yield from enumerate(value, start=1)


def _jsonl_records(where: str, max_line_bytes: int) -> Iterator[tuple[int, Any]]:
    for line, text in read_lines(where, max_line_bytes=max_line_bytes, what="data file"):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except RecursionError:
            raise ValueError(
                f"{where}:{line}: JSON nested too deeply to read; write one flat object per line"
            ) from None
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}:{line}: not valid JSON ({error.msg}); write one object per line") from None
        except ValueError:  # a number past Python's 4300 digits
            raise ValueError(f"{where}:{line}: not valid JSON (a number longer than 4300 digits)") from None
        yield line, record


def _parquet_records(where: str) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"reading {where!r} (parquet) needs pyarrow: pip install 'grpo-gym[datasets]'") from None
    yield from enumerate(pq.read_table(where).to_pylist(), start=1)


def _csv_records(where: str) -> Iterator[tuple[int, Any]]:
    """A ``.csv`` file (UTF-8, a header row of distinct names): ``ValueError`` naming the file and the line of text
    that is not UTF-8, a repeated column name, a row with more fields than the header, or a field longer than
    Python's csv limit (``csv.field_size_limit()``, 131,072 characters)."""
    with open(where, "rb") as handle:
        data = handle.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(
            f"{where}:{line}: not UTF-8 text (byte 0x{data[error.start]:02x}); save the .csv file as UTF-8"
        ) from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = reader.fieldnames or []
        repeated = sorted({name for name in header if header.count(name) > 1})
        if repeated:
            raise ValueError(f"{where}:1: the header names column {repeated[0]!r} more than once; rename one of them")
        records = []
        for row in reader:
            if None in row:  # DictReader's key for the fields past the header's
                fields = len(header) + len(row[None])
                raise ValueError(
                    f"{where}:{reader.line_num}: {fields} fields for a header of {len(header)} columns; quote fields "
                    "that hold commas"
                )
            records.append((reader.line_num, row))
    except csv.Error as error:
        raise ValueError(  # the failing row starts on the line after the last one read in full
            f"{where}:{reader.line_num + 1}: not a readable CSV row ({error}); for fields longer than "
            f"{csv.field_size_limit()} characters use a .jsonl or .parquet file"
        ) from None
    return iter(records)


def _file_records(path: str, max_line_bytes: int) -> Iterator[tuple[int, Any]]:
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUFFIXES:
        raise ArgumentError(f"data file {path!r}: unknown format {suffix or '(no suffix)'!r}; use {DATA_FORMS}")
    if not os.path.isfile(path):
        raise ValueError(f"dataset task: no file at {path!r}; pass {DATA_FORMS}")
    if suffix == ".jsonl":
        return _jsonl_records(path, max_line_bytes)
    if suffix == ".json":
        return _json_records(path, max_line_bytes)
    if suffix == ".parquet":
        return _parquet_records(path)
    return _csv_records(path)


def load_records(
    data: Any, name: str = "data", max_line_bytes: int = MAX_LINE_BYTES
) -> tuple[list[tuple[int, Any]], str]:
    """The rows of ``data`` as ``(line or 1-based index, record)`` pairs, and the prefix messages put before that
    number (``"rows.csv:"``, ``"data row "``).

    :param data: see the module docstring for the accepted forms
    :param name: the argument's name, for messages (``"data"``, ``"eval_data"``)
    :param max_line_bytes: the longest line of a ``.jsonl`` file
    """
    if isinstance(data, (str, os.PathLike)):
        where = os.fspath(data)
        return list(_file_records(where, max_line_bytes)), f"{where}:"
    if _is_hf(data, "DatasetDict", "IterableDatasetDict"):
        splits = ", ".join(map(repr, data.keys()))
        raise ArgumentError(f"{name} is a DatasetDict (splits {splits}); pass one split: {name}=ds['train']")
    if _is_hf(data, "IterableDataset"):
        raise ArgumentError(f"{name} is an IterableDataset; pass a Dataset (e.g. Dataset.from_list(list(it)))")
    if _is_hf(data, "Dataset") or (isinstance(data, Sequence) and not isinstance(data, (bytes, bytearray))):
        return list(enumerate(data, start=1)), f"{name} row "
    raise ArgumentError(f"{name} must be {DATA_FORMS}, got {type(data).__name__}")


class Columns:
    """Which columns hold the prompt, the answer, the solution and the difficulty (checked names)."""

    def __init__(self, prompt: str, answer: str, solution: str | None, difficulty: str | None) -> None:
        for argument, value, required in (
            ("prompt", prompt, True),
            ("answer", answer, True),
            ("solution", solution, False),
            ("difficulty", difficulty, False),
        ):
            if not (isinstance(value, str) and value) and not (value is None and not required):
                wanted = "a column name" + ("" if required else " or None")
                raise ArgumentError(f"{argument} must be {wanted} (task_kwargs of the dataset task), got {value!r}")
        self.prompt, self.answer, self.solution, self.difficulty = prompt, answer, solution, difficulty

    def row(self, record: Any, line: int, where: str) -> Row:
        """One record as a :class:`Row`; ``ValueError`` naming the row, the column and the fix otherwise."""
        at = f"{where}{line}"
        if not isinstance(record, Mapping):
            raise ValueError(f"{at}: each row must be a dict of columns, got {type(record).__name__}")
        for argument in ("prompt", "answer", "solution", "difficulty"):
            column = getattr(self, argument)
            if column is not None and column not in record:
                shown = ", ".join(map(str, list(record)[:20]))
                raise ValueError(f"{at}: no column {column!r} (the {argument}= column); its columns: {shown}")
        prompt = record[self.prompt]
        answer = answer_as_text(record[self.answer], at, f"the answer column {self.answer!r}")
        messages = None
        if isinstance(prompt, (list, tuple)):
            messages = self._messages(prompt, at)
            prompt = next((m["content"] for m in reversed(messages) if m["role"] == "user"), messages[-1]["content"])
        elif not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(
                f"{at}: the prompt column {self.prompt!r} must hold a non-empty string, or a conversation "
                '[{"role": "user", "content": "..."}] (TRL\'s conversational format)'
            )
        checked_text(prompt, at, f"the prompt column {self.prompt!r}")
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError(f"{at}: the answer column {self.answer!r} must hold a non-empty string or a number")
        solution = record[self.solution] if self.solution is not None else None
        checked_solution(checked_text(solution, at, f"the solution column {self.solution!r}"), at,
                         f"the solution column {self.solution!r}")  # fmt: skip
        if solution is not None and not isinstance(solution, str):
            raise ValueError(f"{at}: the solution column {self.solution!r} must hold text (gold reasoning) or null")
        difficulty = None
        if self.difficulty is not None:
            difficulty = self._difficulty(record[self.difficulty], at)
        try:
            columns = plain(dict(record))
        except ValueError as error:
            raise ValueError(f"{at}: {error}; flatten the column") from None
        return Row(prompt, answer.strip(), solution or None, difficulty, line, columns, messages)

    def _messages(self, value: Sequence[Any], at: str) -> list[dict[str, str]]:
        """A conversational prompt's messages as plain ``{"role", "content"}`` dicts (TRL's format, text only)."""
        wanted = f'the prompt column {self.prompt!r} holds a conversation: a list of {{"role": ..., "content": "..."}}'
        if not value:
            raise ValueError(f"{at}: {wanted}, got an empty list")
        messages = []
        for index, message in enumerate(value):
            role = message.get("role") if isinstance(message, Mapping) else None
            content = message.get("content") if isinstance(message, Mapping) else None
            if not isinstance(role, str) or not role:
                raise ValueError(f"{at}: {wanted}; message {index} has no role (got {message!r:.80})")
            if role not in PROMPT_ROLES:
                raise ValueError(
                    f"{at}: {wanted}; message {index} has the role {role!r:.40}, not one of {', '.join(PROMPT_ROLES)} "
                    "(a chat template renders only those)"
                )
            if not isinstance(content, str):
                raise ValueError(
                    f"{at}: {wanted}; message {index} ({role}) must hold text content, got "
                    f"{type(content).__name__} (content parts such as images are not supported)"
                )
            messages.append({"role": role, "content": checked_text(content, at, f"message {index} ({role})")})
        if not any(m["content"].strip() for m in messages):
            raise ValueError(f"{at}: {wanted}; every message is empty")
        if not any(m["role"] == "user" for m in messages):
            raise ValueError(f"{at}: {wanted}; it has no user message (the question the model answers): add one")
        return messages

    def _difficulty(self, value: Any, at: str) -> float:
        if isinstance(value, str):  # a .csv file's values are text
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"{at}: the difficulty column {self.difficulty!r} must hold numbers") from None
        try:
            return check_difficulty(value, name=f"the difficulty column {self.difficulty!r}")
        except ArgumentError as error:
            raise ValueError(f"{at}: {error}") from None


class DatasetTask(RowTask):
    """Problems from your own data (see the module docstring for the forms of ``data`` and the columns).

    :param data: the training rows: a ``datasets.Dataset``, a list of dicts, or a .jsonl/.json/.csv/.parquet path
    :param prompt: the column of the question
    :param answer: the column of the reference answer
    :param solution: the column of gold reasoning text (for the cold start), or ``None``
    :param difficulty: the column of row difficulties in [0.1, 1.0], or ``None`` (rows drawn uniformly)
    :param eval_data: the held-out split, in the same forms and with the same columns, or ``None``
    :param max_line_bytes: the longest line of a .jsonl file, in bytes (16 MiB by default)
    """

    name = "dataset"

    def __init__(
        self,
        data: Any,
        prompt: str = "prompt",
        answer: str = "answer",
        solution: str | None = None,
        difficulty: str | None = None,
        eval_data: Any = None,
        max_line_bytes: int = MAX_LINE_BYTES,
    ) -> None:
        self.columns = Columns(prompt, answer, solution, difficulty)
        self.max_line_bytes = check_int("max_line_bytes", max_line_bytes, low=1)
        rows = self._load(data, "data")
        super().__init__(rows, None if eval_data is None else self._load(eval_data, "eval_data"))

    def _load(self, data: Any, name: str) -> list[Row]:
        if data is None and name == "data":
            raise ArgumentError(f"the dataset task needs {name}=: {DATA_FORMS}")
        records, where = load_records(data, name, self.max_line_bytes)  # type: ignore[arg-type]
        rows = [self.columns.row(record, line, where) for line, record in records]
        if not rows:
            raise ValueError(f"{name}: no rows; give at least one row with a {self.columns.prompt!r} column")
        mixed = next((row for row in rows if (row.messages is None) != (rows[0].messages is None)), None)
        if mixed is not None:
            kinds = ("a conversation", "a string") if rows[0].messages is not None else ("a string", "a conversation")
            raise ValueError(
                f"{where}{mixed.line}: its prompt is {kinds[1]} but the first row's is {kinds[0]}; every row's prompt "
                "must take the same form"
            )
        return rows

    @property
    def conversational(self) -> bool:
        """Whether the prompts are conversations (TRL's conversational format)."""
        return self.rows[0].messages is not None

    @property
    def missing_solutions(self) -> int:
        """How many training rows have no gold reasoning (the cold start gives them a stand-in)."""
        return sum(1 for row in self.rows if not row.solution)
