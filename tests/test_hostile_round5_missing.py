"""Files that leave something out (hostile round five, issue 60): a model zip of the current format that lacks a saved
argument, a run-state entry, an argument of its env record or the frozen reference's weights was edited or damaged,
and is refused naming each entry and the fix (algorithms/common/saving/checks.py ``check_complete``), where a default
took its place without a word before; a file of an earlier format takes the defaults with a warning naming them.
``load``'s keyword arguments are the constructor's; ``--resume`` refuses a checkpoint that lacks what the run needs
before anything is written; a replay-buffer file's header names what it lacks."""

from __future__ import annotations

import hashlib
import inspect
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from algorithms import GRPO, LMPPO, RLOO
from algorithms.cli import main
from algorithms.common.replay.trajectory_buffer import PrioritizedTrajectoryBuffer
from algorithms.common.saving import checks, model_file
from algorithms.common.saving.checkpoints import checkpoints
from algorithms.common.saving.run_file import DATA_KEYS
from grpo_gym.env import R1ZeroEnv
from tests.sizes import TINY
from tests.test_buffer_io import VOCAB, tampered
from tests.test_hostile_files import make_env, rewrite, saved, with_data  # noqa: F401  (saved: the fixture)
from tests.test_hostile_resume import copied, finished, one_line_error  # noqa: F401  (finished: the fixture)


def _refused(path: Path, words: str, **kwargs: Any) -> str:
    with pytest.raises(ValueError, match=words) as refusal:
        GRPO.load(path, env=make_env(), **kwargs)
    message = str(refusal.value)
    assert str(path) in message and "use another save" in message and "\n" not in message
    return message


def _pop(*keys: str):
    """An edit of the ``data`` entry that removes ``data[keys[0]][keys[1]]...``."""

    def edit(data: dict) -> None:
        for key in keys[:-1]:
            data = data[key]
        del data[keys[-1]]

    return edit


@pytest.mark.parametrize(
    ("edit", "entry"),
    [
        (_pop("arguments", "n_groups"), "arguments.n_groups"),  # trained with the default 4 instead of the saved 2
        (_pop("arguments", "seed"), "arguments.seed"),  # seed None: "continues exactly" broken
        (_pop("arguments", "cold_start_kwargs", "steps"), "arguments.cold_start_kwargs.steps"),
        (_pop("arguments", "policy_kwargs", "frozen_parameters"), "arguments.policy_kwargs.frozen_parameters"),
        (_pop("state", "num_timesteps"), "state.num_timesteps"),  # 0, while a missing problem_rng was refused
        (_pop("state", "_between_variance"), "state._between_variance"),  # GRPO's own entry
        (_pop("state", "env_states"), "state.env_states"),  # the envs started afresh
        (lambda data: data["arguments"].update(max_staleness=1), "state.weight_versions"),
        (_pop("env", "record", "kwargs", "template"), "env.record.kwargs.template"),  # rebuilt with r1zero's prompt
    ],
    ids=["n_groups", "seed", "setting", "frozen", "num_timesteps", "grpo-state", "env-states", "versions", "env-arg"],
)
def test_a_current_file_that_lacks_an_entry_is_refused_naming_it(
    saved: Path,  # noqa: F811
    tmp_path: Path,
    edit,
    entry: str,
) -> None:
    """Silent before: each loaded with a default in its place (n_groups 4, seed None, num_timesteps 0, ...)."""
    message = _refused(with_data(saved, tmp_path / "lacks.zip", edit), rf"lacks {entry}, which every file of format")
    assert ("GRPO.load(path, " in message) == entry.startswith("arguments.")  # the arguments may be given instead


def test_the_runs_values_given_to_load_stand_in_for_missing_arguments(saved: Path, tmp_path: Path) -> None:  # noqa: F811
    path = with_data(saved, tmp_path / "lacks.zip", _pop("arguments", "n_groups"))
    assert GRPO.load(path, env=make_env(), n_groups=2).n_groups == 2


def test_a_file_without_the_reference_its_run_kept_is_refused(saved: Path, tmp_path: Path) -> None:  # noqa: F811
    """Before: the reference was rebuilt from the policy without a word (the KL then measured from the wrong place)."""
    path = rewrite(saved, tmp_path / "noref.zip", lambda name, content: None if name == "ref_model.pth" else content)
    _refused(path, r"has no ref_model\.pth \(the frozen reference's weights")
    with pytest.raises(ValueError, match=r"noref\.zip has no ref_model\.pth"):  # SB3's set_parameters(path) too
        GRPO.load(saved, env=make_env()).set_parameters(path)


def test_a_file_saved_without_a_reference_gets_one_when_loaded_with_beta(tmp_path: Path) -> None:
    """The documented tolerance stays: a run saved at beta=0 holds none, and loaded with beta > 0 copies the policy."""
    model = GRPO("TransformerPolicy", make_env(), policy_kwargs=TINY, n_groups=2, group_size=2, cold_start=False,
                 beta=0.0, seed=0)  # fmt: skip
    model.save(tmp_path / "beta0.zip")
    loaded = GRPO.load(tmp_path / "beta0.zip", env=make_env(), beta=0.04)
    assert loaded.ref_model is not None


def test_a_sharded_checkpoint_whose_shards_lost_the_reference_is_refused(tmp_path: Path) -> None:
    """One process writes a sharded checkpoint (whole replicas); its file then records a reference the shards lack."""
    model = GRPO("TransformerPolicy", make_env(), policy_kwargs=TINY, n_groups=2, group_size=2, cold_start=False,
                 beta=0.0, seed=0)  # fmt: skip
    folder = model.save_sharded(tmp_path / "ckpt")
    edited = with_data(folder / "model.zip", tmp_path / "edited.zip", lambda d: (
        d.update(reference=True), d["arguments"].update(beta=0.04)))  # fmt: skip
    shutil.move(edited, folder / "model.zip")
    _refused(folder / "model.zip", "the shards of its checkpoint hold no frozen reference")


def test_set_parameters_of_a_sharded_checkpoints_file_names_load(tmp_path: Path) -> None:
    """Found by the review: the entry check blamed the file ("edited or damaged") for holding no weights."""
    model = GRPO("TransformerPolicy", make_env(), policy_kwargs=TINY, n_groups=2, group_size=2, seed=0)
    folder = model.save_sharded(tmp_path / "ckpt")
    with pytest.raises(ValueError, match=r"its weights are the shards of its checkpoint folder.*GRPO.load\(path\)"):
        model.set_parameters(folder / "model.zip")


def test_an_earlier_formats_file_takes_the_defaults_with_a_warning_naming_them(
    saved: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Files written before this format record fewer arguments and no reference flag: each missing one is named."""

    def earlier(data: dict) -> None:
        data["format"] = model_file.OLDER_FORMATS[-1]
        del data["reference"], data["arguments"]["n_groups"], data["state"]["num_timesteps"]

    path = rewrite(with_data(saved, tmp_path / "old.zip", earlier), tmp_path / "old_noref.zip",
                   lambda name, content: None if name == "ref_model.pth" else content)  # fmt: skip
    with pytest.warns(UserWarning) as warned:
        model = GRPO.load(path, env=make_env())
    said = " ".join(str(warning.message) for warning in warned)
    assert "arguments.n_groups (default 4), state.num_timesteps" in said and "earlier version" in said
    assert "holds no frozen reference (ref_model.pth): the reference is a copy of the loaded policy" in said
    assert (model.n_groups, model.num_timesteps, model.ref_model is not None) == (4, 0, True)


@pytest.mark.parametrize(
    ("algorithm", "kwargs", "words"),
    [
        (GRPO, {"learning_rte": 1e-3}, r"GRPO\.load\(\) got an .* 'learning_rte'; did you mean learning_rate"),
        (GRPO, {"read_optimiser": False}, "did you mean read_optimizer"),
        (GRPO, {"num_generations": 4}, "TRL's name: ours is group_size"),
        (LMPPO, {"beta": 0.1}, "TRL's name: ours is kl_coef"),
    ],
    ids=["typo", "load-option", "trl", "lmppo"],
)
def test_load_refuses_a_keyword_it_does_not_take_naming_the_closest(
    saved: Path,  # noqa: F811
    algorithm: Any,
    kwargs: dict,
    words: str,
) -> None:
    """Before: GRPO.load(p, learning_rte=1e-3) set model.learning_rte, which nothing reads (SB3 does the same)."""
    with pytest.raises(TypeError, match=words):
        algorithm.load(saved, **kwargs)


def test_resume_from_a_checkpoint_without_n_groups_is_refused_and_the_saved_run_kept(
    finished,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    """Before: it trained with n_groups 4 (12 of the run's 8 completions) and overwrote the finished --save-path."""
    directory, argv = copied(finished, tmp_path)
    shutil.copy(finished[0] / "m.zip", tmp_path / "m.zip")
    before = (tmp_path / "m.zip").read_bytes()
    newest = checkpoints(directory)[-1]
    with_data(newest / "model.zip", tmp_path / "edited.zip", _pop("arguments", "n_groups"))
    shutil.move(tmp_path / "edited.zip", newest / "model.zip")
    err = one_line_error([*argv, "-params", "n_groups:2"], capsys)  # the value given is not compared with None
    assert "--resume: " in err and "lacks arguments.n_groups" in err and f"move {str(newest)!r} away" in err
    assert (tmp_path / "m.zip").read_bytes() == before and len(checkpoints(directory)) == 2


def test_resume_of_a_run_with_replay_from_a_checkpoint_without_its_buffer_is_refused(
    finished,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    """Before: the run went on with an empty replay buffer."""
    directory, argv = copied(finished, tmp_path)
    newest = checkpoints(directory)[-1]

    def with_replay(data: dict) -> None:
        data["arguments"]["controls_kwargs"]["replay_ratio"] = 0.25

    with_data(newest / "model.zip", tmp_path / "edited.zip", with_replay)
    shutil.move(tmp_path / "edited.zip", newest / "model.zip")
    err = one_line_error(argv, capsys)
    assert f"{str(newest)!r} has no replay.npz (the replay buffer" in err and "move" in err


def test_eval_of_a_file_whose_env_record_lacks_an_argument_names_it(
    saved: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    """Before: grpo-gym eval rebuilt the env with R1ZeroEnv's default template (r1zero's prompt, not the run's)."""
    path = with_data(saved, tmp_path / "lacks.zip", _pop("env", "record", "kwargs", "template"))
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "the env record lacks the arguments ['template']" in err and "use another save" in err


@pytest.mark.parametrize(
    ("part", "key"),
    [("meta", "ring"), ("meta", "sampler"), ("meta", "reward_min"), ("ring", "_pos"), ("sampler", "rng")],
)
def test_a_replay_buffer_file_that_lacks_a_header_entry_names_it(tmp_path: Path, part: str, key: str) -> None:
    """Before: "invalid replay-buffer file: 'ring'" (a KeyError's text), or a message about the value, not its lack."""

    def change(arrays: dict, meta: dict) -> None:
        del (meta if part == "meta" else meta[part])[key]

    with pytest.raises(ValueError, match=rf"{part}: missing \['{key}'\], which every saved buffer records"):
        PrioritizedTrajectoryBuffer.load(tampered(tmp_path, change), vocab_size=VOCAB)


@pytest.mark.parametrize("algorithm", [GRPO, LMPPO, RLOO])
def test_the_run_state_keys_are_what_get_run_state_writes(algorithm: Any) -> None:
    """``state_attributes`` and ``run_state_keys`` (what a file must hold) follow ``get_run_state``."""
    model = algorithm("TransformerPolicy", make_env(), policy_kwargs=TINY, n_groups=2, group_size=2, seed=0)
    written = set(model.get_run_state()[0])
    assert written == {*algorithm.state_attributes, *algorithm.run_state_keys, "env_states"}


#: what a file of each format holds (a digest of :func:`format_contents`), to catch an entry added without a new format
FORMAT_CONTENTS = {"grpo-gym/2": "4084bc07ed1099ba"}


def format_contents() -> dict[str, Any]:
    """The entries a file of the current format must hold, by algorithm, and the env record's arguments."""
    held: dict[str, Any] = {"data": sorted(DATA_KEYS), "policy_kwargs": sorted(checks.RECORDED_POLICY_KWARGS)}
    for algorithm in (GRPO, LMPPO, RLOO):
        names = [
            f"{name}.{key}" if key else name
            for name, argument in algorithm.arguments.items()
            if argument.saved
            for key in (argument.settings or [""])
        ]
        held[algorithm.__name__] = sorted(names) + sorted({*algorithm.state_attributes, *algorithm.run_state_keys})
    held["env"] = sorted(inspect.signature(R1ZeroEnv).parameters)
    return held


def test_what_a_file_of_the_current_format_holds_is_recorded() -> None:
    """A saved argument, run-state entry or env argument added without a new format would make every file written
    before it look damaged (refused): a new one needs a new format, under which those files read as older ones."""
    digest = hashlib.sha256(json.dumps(format_contents(), sort_keys=True).encode()).hexdigest()[:16]
    assert FORMAT_CONTENTS.get(model_file.FORMAT) == digest, (
        f"what a {model_file.FORMAT!r} file holds changed: set model_file.FORMAT to a new format, add "
        f"{model_file.FORMAT!r} to model_file.OLDER_FORMATS, and record {{<the new format>: {digest!r}}} here"
    )
