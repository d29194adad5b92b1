"""Constructor arguments (algorithms/common/arguments.py, algorithms/grpo/arguments.py): every bad value is
refused when the object is built, with the argument's name in the message."""

from __future__ import annotations

import inspect
import math
import re

import pytest
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.utils import LinearSchedule
from stable_baselines3.common.vec_env import DummyVecEnv

import grpo_gym
from algorithms import GRPO, UpdateDecay
from tests.sizes import ENV_KWARGS, TINY

NAN, INF = float("nan"), math.inf
BAD_GRPO = [
    ("learning_rate", NAN), ("learning_rate", -1e-3), ("learning_rate", "1e-5"),
    ("learning_rate", LinearSchedule(1e-3, NAN, 1.0)), ("learning_rate", lambda progress: 1 / (progress - 1)),
    ("n_groups", 0), ("n_groups", 2.7), ("n_groups", True), ("n_groups", "4"),
    ("group_size", 1), ("group_size", 4.5), ("n_epochs", 0), ("batch_size", 0), ("batch_size", 1.5),
    ("clip_range", NAN), ("clip_range", -0.1), ("clip_range_high", NAN),
    ("beta", NAN), ("beta", INF), ("beta", -1.0), ("ent_coef", NAN), ("ent_coef", UpdateDecay(0.01, NAN, 10)),
    ("max_grad_norm", NAN), ("max_grad_norm", 0.0), ("vf_coef", NAN), ("vf_coef", -1.0),
    ("gamma", NAN), ("gamma", 0.0), ("gamma", 1.5),
    ("advantage_scale", "rank"), ("loss_aggregation", "mean"),
    ("competition", "yes"), ("competition_coef", NAN), ("competition_coef", 0.0),
    ("diversity_guard", 1), ("diversity_threshold", -0.1), ("update_mode", "parallel"),
    ("advantage_baseline", "mean"), ("reward_ramp", "no"), ("protected_rollouts", -1), ("protected_rollouts", 2.7),
    ("curriculum", None), ("diagnostics", "true"), ("replay_ratio", 1.0), ("replay_ratio", NAN),
    ("max_replay_age", -1), ("replay_buffer_kwargs", {"capacty": 10}),
    ("importance_level", "episode"), ("dynamic_sampling", "yes"), ("max_resample_rounds", -1),
    ("max_resample_rounds", 1.5), ("mask_truncated", 1), ("prompt_sampling", "priority"), ("prompt_pool_size", 0),
    ("fresh_prompt_fraction", 1.5), ("fresh_prompt_fraction", NAN), ("gradient_compression", "zip"),
    ("dist_timeout", 0.0), ("max_staleness", -1), ("max_staleness", 1.5), ("mixed_precision", "fp8"),
    ("cold_start", "yes"), ("sft_steps", -5), ("sft_steps", 2.5), ("sft_batch_size", 0), ("sft_learning_rate", NAN),
    ("sft_data", 3),
    ("stats_window_size", 0), ("verbose", -1), ("seed", -3), ("seed", 1.5),
    ("policy_kwargs", {"tempreature": 0.5}), ("policy_kwargs", {"temperature": 0.0}),
    ("policy_kwargs", {"top_p": NAN}), ("policy_kwargs", {"top_p": 1.5}), ("policy_kwargs", {"top_k": -1}),
    ("policy_kwargs", {"memory_length": 2.7}), ("policy_kwargs", {"value_head": "no"}),
    ("policy_kwargs", {"gradient_checkpointing": 0}), ("policy_kwargs", {"model_kwargs": {"hiden_size": 8}}),
]  # fmt: skip


def env() -> DummyVecEnv:
    return DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**ENV_KWARGS))])


BAD_IDS = [f"{n}={getattr(v, '__name__', v)!r}"[:40] for n, v in BAD_GRPO]  # a lambda by name, not its address


@pytest.mark.parametrize(("name", "value"), BAD_GRPO, ids=BAD_IDS)
def test_a_bad_value_is_refused_at_construction(name: str, value: object) -> None:
    """Each value by its rule; a setting of a settings dict (``sft_steps`` is ``cold_start_kwargs["steps"]``) given
    in its dict, the message naming the dict and the key."""
    kwargs = {"n_groups": 2, "group_size": 4, "cold_start": False, "policy_kwargs": TINY}
    group, key = GRPO.arguments.flat_names().get(name, (name, name))
    if name == "policy_kwargs":
        kwargs["policy_kwargs"] = {**TINY, **value}
        shown = next(iter(value)).rstrip("s")
    elif group != name:
        kwargs[group] = {key: value}
        shown = re.escape(f"{group}[{key!r}]")
    else:
        kwargs[name], shown = value, name
    with pytest.raises((ValueError, TypeError), match=shown):
        GRPO("TransformerPolicy", env(), **kwargs)


@pytest.mark.parametrize("name", ["sft_steps", "diagnostics", "replay_ratio"])
def test_a_flat_name_of_an_earlier_version_names_its_settings_dict(name: str) -> None:
    """``GRPO(sft_steps=0)`` worked before the settings dicts: now a ``TypeError`` says where it lives (TRL's names,
    ``vllm_mode``, get TRL's hint, which names the same place); a model file of that version still loads
    (``Arguments.regrouped``)."""
    group, key = GRPO.arguments.flat_names()[name]
    with pytest.raises(TypeError, match=re.escape(f"{name} is now a setting of {group}: pass {group}={{{key!r}: 1}}")):
        GRPO("TransformerPolicy", env(), policy_kwargs=TINY, **{name: 1})
    assert GRPO.arguments.regrouped({name: 1, "n_groups": 2}) == {group: {key: 1}, "n_groups": 2}


def test_a_model_file_of_an_earlier_version_loads_with_its_flat_names(tmp_path) -> None:
    """A file written before the settings dicts records ``sft_steps``, ``vllm_mode``, ``replay_ratio`` flat: load
    puts each in its dict."""
    from tests.test_hostile_files import with_data

    model = GRPO("TransformerPolicy", env(), policy_kwargs=TINY, n_groups=2, group_size=4, cold_start=False,
                 cold_start_kwargs={"steps": 7}, controls_kwargs={"replay_ratio": 0.25})  # fmt: skip
    model.save(tmp_path / "new.zip")

    def flatten(data: dict) -> None:
        arguments = data["arguments"]
        for name, (group, key) in GRPO.arguments.flat_names().items():
            arguments[name] = arguments[group][key]
        for group in ("rollout_engine_kwargs", "cold_start_kwargs", "controls_kwargs"):
            del arguments[group]

    old = with_data(tmp_path / "new.zip", tmp_path / "old.zip", flatten)
    loaded = GRPO.load(old, env=env())
    assert (loaded.sft_steps, loaded.replay_ratio, loaded.vllm_mode) == (7, 0.25, "colocate")
    assert loaded._constructor_arguments()["cold_start_kwargs"]["steps"] == 7


@pytest.mark.parametrize(
    "name, value, instead",
    [
        ("drop_uniform_groups", True, "dynamic_sampling=True with max_resample_rounds=0"),
        ("sequence_clip_range", 3e-4, "clip_range=... with importance_level='sequence'"),
        ("sequence_clip_range_high", 4e-4, "clip_range_high=... with importance_level='sequence'"),
    ],
)
def test_a_retired_argument_names_what_to_pass_instead(name: str, value, instead: str) -> None:
    with pytest.raises(TypeError, match=re.escape(f"GRPO(): {name} is gone: pass {instead}")):
        GRPO("TransformerPolicy", env(), policy_kwargs=TINY, **{name: value})


def test_a_name_both_retired_and_declared_is_refused_when_the_table_is_built() -> None:
    with pytest.raises(ValueError, match=r"retired and declared: \['n_groups'\]"):
        GRPO.arguments.extended("n_groups", {}, {"n_groups": GRPO.arguments.retired["drop_uniform_groups"]})


@pytest.mark.parametrize(
    "recorded, loaded",
    [
        ({"drop_uniform_groups": True}, {"dynamic_sampling": True, "max_resample_rounds": 0}),
        ({"drop_uniform_groups": True, "dynamic_sampling": True}, {"dynamic_sampling": True, "max_resample_rounds": 3}),
        ({"drop_uniform_groups": False}, {"dynamic_sampling": False, "max_resample_rounds": 3}),
        (
            {"importance_level": "sequence", "sequence_clip_range": 3e-4, "sequence_clip_range_high": 4e-4},
            {"importance_level": "sequence", "clip_range": 3e-4, "clip_range_high": 4e-4},
        ),
        (
            {"sequence_clip_range": 3e-4, "sequence_clip_range_high": 4e-4},
            {"importance_level": "token", "clip_range": 0.2, "clip_range_high": None},
        ),
    ],
    ids=["drop", "drop-with-refills", "drop-off", "gspo", "gspo-unused"],
)
def test_a_model_file_with_retired_arguments_loads_as_what_they_stood_for(tmp_path, recorded, loaded) -> None:
    """A file of an earlier version records ``drop_uniform_groups`` or GSPO's ``sequence_clip_range*``: load reads
    them as the arguments that cover them now, and the model trains as it did."""
    from tests.test_hostile_files import with_data

    model = GRPO("TransformerPolicy", env(), policy_kwargs=TINY, n_groups=2, group_size=4, cold_start=False)
    model.save(tmp_path / "new.zip")
    old = with_data(tmp_path / "new.zip", tmp_path / "old.zip", lambda data: data["arguments"].update(recorded))
    model = GRPO.load(old, env=env())
    value = {name: getattr(model, name) for name in loaded}  # the clip ranges as schedules of the progress
    assert {name: v(1.0) if callable(v) else v for name, v in value.items()} == pytest.approx(loaded)
    assert not any(hasattr(model, name) for name in GRPO.arguments.retired)
    model.learn(8, reset_num_timesteps=False)


def test_a_retired_argument_is_read_as_the_run_it_is_loaded_into(tmp_path) -> None:
    """An earlier version's GSPO file loaded with ``importance_level="token"``: its sequence range stayed with the
    sequence ratio, so the token run clips at the file's ``clip_range`` (0.2), not at 3e-4."""
    from tests.test_hostile_files import with_data

    model = GRPO("TransformerPolicy", env(), policy_kwargs=TINY, n_groups=2, group_size=4, cold_start=False)
    model.save(tmp_path / "new.zip")
    gspo = {"importance_level": "sequence", "sequence_clip_range": 3e-4, "sequence_clip_range_high": 4e-4}
    old = with_data(tmp_path / "new.zip", tmp_path / "old.zip", lambda data: data["arguments"].update(gspo))
    with pytest.warns(UserWarning, match="GSPO's paper uses"):  # the file's own level, left as it is: warned
        as_saved = GRPO.load(old, env=env(), importance_level="sequence", clip_range=0.2)
    assert as_saved.clip_range(1.0) == 0.2  # an explicit override wins over the translation
    token = GRPO.load(old, env=env(), importance_level="token")
    settings = token._loss_settings()
    assert (settings.importance_level, settings.clip_low, settings.clip_high) == ("token", 0.2, 0.2)
    assert GRPO.load(old, env=env())._loss_settings().clip_low == pytest.approx(3e-4)


def test_every_keyword_is_in_the_signature() -> None:
    """What IDEs, ``help`` and ``inspect`` show: every argument by name (71 flat ones before the settings dicts); at
    most 40 parameters in all, ``policy``, ``env`` and ``_init_setup_model`` counted (SB3's PPO has 26)."""
    assert list(inspect.signature(GRPO).parameters) == ["policy", "env", *GRPO.arguments, "_init_setup_model"]
    assert len(inspect.signature(GRPO).parameters) <= 40, len(inspect.signature(GRPO).parameters)


def test_integral_floats_and_numpy_numbers_are_read_as_their_values() -> None:
    import numpy as np

    model = GRPO(
        "TransformerPolicy", env(), n_groups=2.0, group_size=np.int64(4), beta=np.float32(0.0), cold_start=False,
        policy_kwargs=TINY,
    )  # fmt: skip
    assert model.n_groups == 2 and isinstance(model.n_groups, int) and model.group_size == 4


class Scorer:
    """A reward model that raises on every call, or on every other one."""

    def __init__(self, every: int) -> None:
        self.every, self.calls = every, 0

    def score(self, prompts: list[str], completions: list[str]) -> list[float]:
        self.calls += 1
        if self.calls % self.every == 0:
            raise KeyError(f"scorer call {self.calls}")
        return [0.5] * len(completions)


def scored_env(every: int, n_envs: int = 1) -> DummyVecEnv:
    """Envs sharing one scorer; each env scores its completions of a rollout in one call (``score_ahead``)."""
    scorer = Scorer(every)
    return DummyVecEnv([lambda: Monitor(grpo_gym.R1ZeroEnv(**ENV_KWARGS, reward_model=scorer))] * n_envs)


def test_every_completion_erring_stops_training_with_the_error() -> None:
    model = GRPO("TransformerPolicy", scored_env(1), n_groups=2, group_size=4, cold_start=False, policy_kwargs=TINY)
    with pytest.warns(RuntimeWarning, match="scorer call"), pytest.raises(RuntimeError, match="every completion"):
        model.learn(8)


def test_reward_errors_are_counted_in_tensorboard(tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = GRPO(
        "TransformerPolicy", scored_env(2, n_envs=2), n_groups=2, group_size=4, cold_start=False, policy_kwargs=TINY,
        tensorboard_log=str(tmp_path),
    )  # fmt: skip
    with pytest.warns(RuntimeWarning, match="scorer call"):
        model.learn(8)
    events = EventAccumulator(str(tmp_path / "GRPO_1")).Reload()
    assert [e.value for e in events.Scalars("rollout/reward_errors")] == [4.0]  # env 1's call raised: its 4 of 8


def test_every_argument_is_declared_once_with_a_rule_and_a_docstring_entry() -> None:
    """The signature, the docstring's ``:param:`` lines and the checks come from one table per algorithm: the
    shared arguments' and the algorithm's own, none declared twice, each with one rule."""
    import inspect

    from algorithms import LMPPO
    from algorithms.common.lm_arguments import LM_ARGUMENTS
    from algorithms.grpo.arguments import GRPO_ARGUMENTS, GRPO_OWN
    from algorithms.ppo.arguments import LMPPO_ARGUMENTS, LMPPO_OWN

    for algorithm, table, own in ((GRPO, GRPO_ARGUMENTS, GRPO_OWN), (LMPPO, LMPPO_ARGUMENTS, LMPPO_OWN)):
        names = [name for name in inspect.signature(algorithm.__init__).parameters if name != "self"]
        assert names == ["policy", "env", *table, "_init_setup_model"]
        assert set(table) == set(LM_ARGUMENTS) | set(own) and not set(own) & set(LM_ARGUMENTS)
        undocumented = [name for name in names if f":param {name}:" not in (algorithm.__doc__ or "")]
        assert not undocumented
        defaults = {name: p.default for name, p in inspect.signature(algorithm.__init__).parameters.items()}
        assert all(defaults[name] == argument.default for name, argument in table.items())
    assert GRPO_ARGUMENTS["group_size"].rule("group_size", 2) == 2 and LMPPO_ARGUMENTS["group_size"].default == 1
    with pytest.raises(ValueError, match=r"group_size must be an integer in \[2, 1000000\]"):
        GRPO_ARGUMENTS["group_size"].rule("group_size", 1)


def test_the_constructor_takes_its_signature_from_the_table() -> None:
    """An algorithm writes ``__init__(self, policy, env, **kwargs)``: the table gives the signature (``inspect`` and
    ``help`` see every argument with its default), the keywords arrive with the defaults filled in, and a constructor
    written another way is refused at import, naming the form."""
    import inspect

    from algorithms import LMPPO
    from algorithms.grpo.arguments import GRPO_ARGUMENTS

    assert inspect.signature(GRPO) == GRPO_ARGUMENTS.signature().replace(
        parameters=list(GRPO_ARGUMENTS.signature().parameters.values())[1:]
    )
    assert inspect.signature(LMPPO).parameters["n_groups"].default == 32
    received = {}

    @GRPO_ARGUMENTS.constructor
    def __init__(self, policy, env, **kwargs):
        received.update(policy=policy, env=env, **kwargs)

    __init__(object(), "TransformerPolicy", None, n_groups=5)
    assert received["n_groups"] == 5 and received["group_size"] == 8 and received["_init_setup_model"] is True
    assert set(received) == {"policy", "env", *GRPO_ARGUMENTS, "_init_setup_model"}

    def written_out(self, policy, env, learning_rate=1e-05, n_groups=5, _init_setup_model=True):
        pass

    with pytest.raises(TypeError, match=r"must be written \(self, policy, env, \*\*kwargs\)"):
        GRPO_ARGUMENTS.constructor(written_out)


def test_k_and_g_set_on_a_built_model_are_refused_naming_the_constructor_and_load() -> None:
    """The advantages step is a part built from n_groups and group_size: changing them on a built model would group
    the rollouts it collects wrongly, so learn refuses before the first rollout and names where they go."""
    model = GRPO("TransformerPolicy", env(), n_groups=2, group_size=4, cold_start=False, policy_kwargs=TINY, seed=0)
    model.group_size = 2
    with pytest.raises(ValueError, match=r"built with 2, 4 .*GRPO.load\(path, n_groups=..., group_size=...\)"):
        model.learn(8)
    assert model.num_timesteps == 0


def test_load_refuses_a_settings_key_given_flat_naming_its_dict(tmp_path) -> None:
    """load(path, **kwargs) passes the saved arguments through the constructor; a key of a settings dict given flat
    would only set an attribute the parts built from the dict never read: refused, as the constructor refuses it."""
    model = GRPO("TransformerPolicy", env(), n_groups=2, group_size=4, cold_start=False, policy_kwargs=TINY, seed=0)
    model.save(tmp_path / "model.zip")
    with pytest.raises(TypeError, match=r"GRPO.load\(\): turn_credit is now a setting of turn_kwargs: pass turn_kwarg"):
        GRPO.load(tmp_path / "model.zip", env=env(), turn_credit="reward_to_go")
    loaded = GRPO.load(tmp_path / "model.zip", env=env(), turn_kwargs={"credit": "reward_to_go"})
    assert loaded.scoring.turn_credit == "reward_to_go"


def test_positional_arguments_bind_as_the_signature_says() -> None:
    """SB3's positional order (policy, env, learning_rate, ...) still binds; unknown names still say ours."""
    model = GRPO("TransformerPolicy", env(), 3e-4, 2, 4, cold_start=False, policy_kwargs=TINY, _init_setup_model=False)
    assert (model.learning_rate, model.n_groups, model.group_size) == (3e-4, 2, 4)
    with pytest.raises(TypeError, match="multiple values for argument 'n_groups'"):
        GRPO("TransformerPolicy", env(), 3e-4, 2, n_groups=2, _init_setup_model=False)


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"max_resample_rounds": 7}, "max_resample_rounds=7 has no effect with dynamic_sampling=False"),
        (
            {"rollout_engine_kwargs": {"mode": "server"}},
            "rollout_engine_kwargs['mode']='server' has no effect with rollout_engine='builtin'",
        ),
        (
            {"controls_kwargs": {"replay_buffer_kwargs": {"capacity": 64}}},
            "pass controls_kwargs['replay_ratio'] > 0 to use it",
        ),
        (
            {"controls_kwargs": {"competition_coef": 2.0}},
            "controls_kwargs['competition_coef']=2.0 has no effect with controls_kwargs['competition']=None",
        ),
        (
            {"cold_start": False, "cold_start_kwargs": {"learning_rate": 1e-4}},
            "cold_start_kwargs['learning_rate']=0.0001 has no effect with cold_start",
        ),
    ],
    ids=["resample", "vllm", "replay", "competition", "cold-start"],
)
def test_a_setting_whose_part_is_off_is_named_in_a_warning(settings: dict, words: str) -> None:
    """Hostile round four, options in combination: each was taken without a word and ignored. A warning, not an
    error: a preset holds a part's settings and a run switches the part off (``-params cold_start:False``)."""
    kwargs = {"n_groups": 2, "group_size": 4, "cold_start": False, "policy_kwargs": TINY, **settings}
    with pytest.warns(UserWarning, match=re.escape(words)) as record:
        GRPO("TransformerPolicy", env(), **kwargs)
    assert {w.filename for w in record if words in str(w.message)} == {__file__}  # the user's line, not ours


def test_defaults_and_a_part_switched_on_warn_about_nothing(recwarn: pytest.WarningsRecorder) -> None:
    GRPO("TransformerPolicy", env(), n_groups=2, group_size=4, cold_start=False, policy_kwargs=TINY)
    GRPO("TransformerPolicy", env(), n_groups=2, group_size=4, cold_start=False, policy_kwargs=TINY,
         dynamic_sampling=True, max_resample_rounds=7)  # fmt: skip
    assert not [w for w in recwarn if "has no effect" in str(w.message)]
