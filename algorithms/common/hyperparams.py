"""Hyperparameter files in the rl-baselines3-zoo format, with named presets.

The top-level keys are env ids (``R1Zero-v0``), as rl-zoo3 expects; they hold the default preset (published
GRPO: the algorithm's own defaults). Other presets are top-level keys ``<env id>-<preset>`` (``R1Zero-v0-seed``,
``R1Zero-v0-demo``), which rl-zoo3 ignores. Values follow rl-zoo3: ``n_timesteps``, ``policy``, ``n_envs``,
``env_kwargs``, ``policy_kwargs`` (mappings; a string is read as a dict literal, ``dict(...)`` is never evaluated) and
``lin_<x>`` for a linear schedule from ``x`` to 0; every other key is a ``GRPO`` argument. Write floats as
``1.0e-5`` (YAML reads ``1e-5`` as a string).
"""

from __future__ import annotations

import ast
import difflib
import importlib.resources
import re
from pathlib import Path
from typing import Any

import yaml
from stable_baselines3.common.utils import LinearSchedule

SCHEDULABLE = ("learning_rate", "clip_range", "clip_range_high", "ent_coef")
#: the keys of a preset that are not constructor arguments of the algorithm (``grpo-gym train`` uses them)
RUN_KEYS = (
    "n_timesteps", "policy", "n_envs", "env_kwargs", "eval_difficulties", "eval_problems", "eval_greedy",
    "eval_samples", "save_path",
)  # fmt: skip


def default_config(name: str = "grpo.yml") -> Path:
    """The shipped config file: ``zoo_configs/<name>``, packaged as ``algorithms.zoo_configs`` in a wheel (the
    source checkout's top-level folder when running from it)."""
    try:
        packaged = Path(str(importlib.resources.files("algorithms.zoo_configs").joinpath(name)))
        if packaged.is_file():
            return packaged
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parents[2] / "zoo_configs" / name


DEFAULT_CONFIG = default_config()


def preset_key(env_id: str, preset: str | None) -> str:
    """The top-level key holding ``preset`` for ``env_id`` (the env id itself for the default preset)."""
    return env_id if preset in (None, "", "default") else f"{env_id}-{preset}"


def check_keys(config: dict[str, Any], valid: set[str], where: str) -> None:
    """Reject keys that are not in ``valid``, naming the closest valid one and listing them all."""
    for key in config:
        if key not in valid:
            close = difflib.get_close_matches(key, sorted(valid), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{where}: unknown key {key!r}{hint}; valid keys: {', '.join(sorted(valid))}")


def parse_value(text: str) -> Any:
    """A command-line or config value: a Python literal when it is one, else the string itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


class Fields(dict):
    """Keys of a settings dict given one by one on the command line (``-params cold_start_kwargs.steps:2``): they go
    over the preset's dict key by key, whichever dict it is (``env_kwargs.difficulty:0.5`` keeps the preset's other
    env arguments)."""


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["learning_rate:1e-5", "n_groups:8"]`` (rl-zoo3's ``-params`` syntax; ``=`` works too) as a dict. A dotted key,
    ``cold_start_kwargs.steps:2`` (the form ``grpo-gym train --help`` lists a preset's settings in), sets one key of
    that settings dict (:class:`Fields`)."""
    overrides: dict[str, Any] = {}
    for item in items:
        cut = min((i for i in (item.find(":"), item.find("=")) if i >= 0), default=-1)
        key, value = (item[:cut].strip(), item[cut + 1 :]) if cut >= 0 else (item, "")
        if cut < 0 or not key:
            raise ValueError(f"override {item!r} must look like key:value, e.g. learning_rate:1e-5")
        name, dot, field = key.partition(".")
        if not dot:
            overrides[key] = parse_value(value.strip())
            continue
        if not (name and field) or "." in field:
            raise ValueError(
                f"override {item!r}: a dotted key names one setting of a settings dict, e.g. "
                "cold_start_kwargs.steps:20 (or give the whole dict: \"cold_start_kwargs:{'steps': 20}\")"
            )
        given = overrides.get(name)
        if given is not None and not isinstance(given, dict):
            raise ValueError(f"override {item!r}: {name} is given whole as well ({name}:{given!r:.40}); give it once")
        overrides[name] = Fields({**(given or {}), field: parse_value(value.strip())})
    return overrides


_FLOAT_LOOKING = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def _schedule(key: str, value: Any) -> Any:
    if isinstance(value, str) and value.startswith("lin_"):
        try:
            start = float(value[len("lin_") :])
        except ValueError:
            raise ValueError(f"{key}: {value!r} is not a lin_<x> schedule; write e.g. lin_1.0e-5") from None
        return LinearSchedule(start, 0.0, 1.0)
    if isinstance(value, str):
        raise ValueError(f"{key}: {value!r} is not a number or a lin_<x> schedule (write floats as 1.0e-5)")
    return value


_MAPPING_EXAMPLES = {"policy_kwargs": "{'model': 'tiny'}", "env_kwargs": "{'task': 'countdown'}"}


def _mapping(key: str, value: Any) -> dict[str, Any]:
    """``policy_kwargs`` / ``env_kwargs``: a mapping, or a string holding a Python dict literal (rl-zoo3 writes
    ``"dict(...)"``, which would have to be evaluated as code: it is refused, naming the literal to write)."""
    example = _MAPPING_EXAMPLES[key]
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise ValueError(
                f"{key}: {value!r:.120} is not a Python dict literal; write a mapping such as {example} (on the "
                f'command line: -params "{key}:{example}"); dict(...) and other code is never evaluated'
            ) from None
    if not isinstance(value, dict):
        raise ValueError(f"{key} must be a mapping such as {example}, got {type(value).__name__} {value!r}")
    return value


def _check_floats(config: dict[str, Any]) -> None:
    """YAML reads ``1e-5`` as a string: name the key and the fix instead of failing later in GRPO."""
    for key, value in config.items():
        if isinstance(value, str) and _FLOAT_LOOKING.match(value):
            raise ValueError(f"{key}: {value!r} was read as a string; write it as {float(value):.1e} (e.g. 1.0e-5)")


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key written twice in one mapping (PyYAML keeps the last without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str):
                if key in seen:
                    problem = f"the key {key!r} is written twice (only the last would count); keep one"
                    raise yaml.constructor.ConstructorError(None, None, problem, key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_config(path: Path) -> dict[str, Any]:
    """The YAML document of a config file, a mapping of entries; ``ValueError`` naming the file (and the line of a
    syntax error) when it is not one. Read with ``yaml.SafeLoader``: a tag that would build a Python object is an
    error, never a call; a key written twice in one mapping is an error too."""
    if not path.exists():
        raise ValueError(f"config file {path} does not exist; pass --config <file> (see zoo_configs/grpo.yml)")
    try:
        with path.open(encoding="utf-8") as handle:
            document = yaml.load(handle, Loader=_UniqueKeyLoader)  # a SafeLoader
    except OSError as error:
        raise ValueError(f"config file {path} cannot be read ({error.strerror or error}); pass a YAML file") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"config file {path} is not UTF-8 text (byte {error.start}); save it as UTF-8") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or " ".join(str(error).split())[:200]
        raise ValueError(f"config file {path} is not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise ValueError(f"config file {path} nests lists or mappings too deeply to read; flatten it") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ValueError(f"config file {path} must map env ids to hyperparameters, got a {type(document).__name__}")
    return document


#: the most envs a config may ask for: each is a whole env in this process (tool episodes want up to K x G)
MAX_ENVS = 4096


def check_run_keys(config: dict[str, Any], where: str) -> None:
    """The run keys of a preset (:data:`RUN_KEYS`) with the types ``grpo-gym train`` reads them in; ``ValueError``
    naming ``where``, the key and what it takes."""
    from grpo_gym.validation import check_bool, check_float, check_int

    try:
        for key, high in (("n_timesteps", None), ("n_envs", MAX_ENVS), ("eval_problems", None)):
            if key in config:
                check_int(key, config[key], low=1, high=high)
        levels = config.get("eval_difficulties")
        if levels is not None and not (isinstance(levels, list) and levels):
            raise ValueError(f"eval_difficulties must be a list of difficulties, e.g. [0.1, 0.5], got {levels!r:.60}")
        for level in levels or []:
            check_float("eval_difficulties", level, low=0.1, high=1.0)
        check_bool("eval_greedy", config.get("eval_greedy", False))
        check_int("eval_samples", config.get("eval_samples", 0), low=0)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    if config.get("policy", "TransformerPolicy") != "TransformerPolicy":
        raise ValueError(f"{where}: policy must be 'TransformerPolicy', got {config['policy']!r:.60}")
    save_path = config.get("save_path")
    if save_path is not None and not (isinstance(save_path, str) and save_path.strip()):
        raise ValueError(f"{where}: save_path must be a file name such as model.zip, got {save_path!r:.60}")


#: the dicts an override replaces whole, as rl-zoo3 does
REPLACED = ("policy_kwargs", "env_kwargs")

#: an optional part's switch, its settings dict, and whether a value of the switch turns the part off: when
#: ``-params`` turns the part off, the preset's settings of it go with it (no warning blames the user for them)
PART_SETTINGS: dict[str, tuple[str, Any]] = {"cold_start": ("cold_start_kwargs", lambda value: value is False)}


def merged_over(name: str, value: Any, base: Any) -> bool:
    """Whether an override ``value`` of ``name`` goes key by key over ``base`` (a settings dict such as
    ``cold_start_kwargs``: both dicts, the name not in :data:`REPLACED`) rather than replacing it."""
    if isinstance(value, Fields):
        return isinstance(base, dict)
    return name.endswith("_kwargs") and name not in REPLACED and isinstance(value, dict) and isinstance(base, dict)


def load_hyperparams(
    path: str | Path, env_id: str, preset: str | None = None, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The hyperparameters of ``env_id``'s ``preset`` in ``path``, with ``overrides`` applied and schedules built. An
    override replaces the preset's value (rl-zoo3's ``-params``), but for a settings dict other than ``policy_kwargs``
    and ``env_kwargs`` (``cold_start_kwargs``, ``rollout_engine_kwargs``, ``controls_kwargs``), whose keys go over
    the preset's."""
    path = Path(path)
    document = read_config(path)
    key = preset_key(env_id, preset)
    if key not in document:
        presets = sorted(k for k in document if k == env_id or k.startswith(f"{env_id}-"))
        raise ValueError(f"{path} has no entry {key!r}; entries for {env_id}: {presets}")
    if not isinstance(document[key], dict):
        raise ValueError(
            f"{path}: the entry {key!r} must be a mapping of hyperparameters (n_timesteps: ..., learning_rate: ...), "
            f"got {type(document[key]).__name__} {document[key]!r:.60}"
        )
    config = {**document[key], **(overrides or {})}
    for name, value in (overrides or {}).items():  # a settings dict's keys over the preset's (cold_start_kwargs)
        preset_value = document[key].get(name)
        if isinstance(value, Fields) and not (name.endswith("_kwargs") and isinstance(preset_value, dict | None)):
            raise ValueError(
                f"{path} [{key}]: {name} is not a settings dict (those end in _kwargs: cold_start_kwargs.steps:20); "
                f"write -params {name}:VALUE"
            )
        if merged_over(name, value, preset_value):
            config[name] = {**preset_value, **value}
        elif isinstance(value, Fields):
            config[name] = dict(value)
    for switch, (settings, off) in PART_SETTINGS.items():  # the preset's settings of a part -params turns off
        if switch in (overrides or {}) and off(config.get(switch)) and settings not in (overrides or {}):
            config.pop(settings, None)
    _check_floats(config)
    check_run_keys(config, f"{path} [{key}]")
    for name in ("policy_kwargs", "env_kwargs"):
        if config.get(name) is not None:
            config[name] = _mapping(name, config[name])
    for name in SCHEDULABLE:
        if name in config:
            config[name] = _schedule(name, config[name])
    config.setdefault("n_timesteps", 10_000)
    return config
