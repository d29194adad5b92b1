"""Hostile round five (issue 60), what the first pass left: a reward a GEM env or an OpenEnv server hands back is
checked as a wrapped env's is (it was ``float()``-ed first, so ``"0.5"`` trained as 0.5); a saved env state that lacks
a field is refused naming it (it was filled in silently), while a state of the earlier format takes the defaults of
the fields added since with a warning; and a run whose optimizer steps are skipped for non-finite gradients says so
(only ``train/skipped_steps`` did)."""

from __future__ import annotations

import json
import re
import warnings
from decimal import Decimal
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from algorithms import GRPO
from grpo_gym import R1ZeroEnv
from grpo_gym.env_state import OLDER_STATE_FORMATS, STATE_FORMAT
from grpo_gym.validation import ReturnTypeError
from tests.sizes import ENV_KWARGS, TINY
from tests.test_hostile_files import saved, with_data  # noqa: F401  (saved: the fixture)

# ---------------------------------------------------------------------------------------------- rewards from outside


def test_a_gem_envs_reward_is_checked_naming_the_env() -> None:
    """Before: "0.5" trained as 0.5, "abc" was "could not convert string to float", terminated "False" ended the
    episode."""
    pytest.importorskip("gem")
    from gem.core import Env as GemEnv

    from grpo_gym.interop.gem import gem_env

    class Fake(GemEnv):
        def __init__(self, reward: Any, terminated: Any = True) -> None:
            super().__init__()
            self.reward, self.terminated = reward, terminated

        def reset(self, seed: int | None = None) -> tuple[str, dict]:
            return "Say hi", {}

        def step(self, action: str) -> tuple[str, Any, Any, bool, dict]:
            return "done", self.reward, self.terminated, False, {}

    def stepped(reward: Any, terminated: Any = True) -> tuple[Any, ...]:
        env = gem_env(Fake(reward, terminated), max_new_tokens=8, context_length=128)
        env.reset(seed=0)
        return env.step(env.encode_action("hi"))

    for reward, shown in (("0.5", "'0.5' (str)"), ("abc", "'abc' (str)"), (b"1", "b'1' (bytes)")):
        with pytest.raises(
            ReturnTypeError, match=rf"the step of the GEM env 'Fake' returned {re.escape(shown)}, not a"
        ):
            stepped(reward)
    with pytest.raises(ReturnTypeError, match=r"the step of the GEM env 'Fake': terminated returned 'False' \(str\)"):
        stepped(1.0, terminated="False")
    assert stepped(1.0, terminated=1)[2] is True and stepped(1.0, terminated=np.bool_(True))[2] is True  # as Gymnasium
    for reward, shown in ((float("nan"), "nan"), (10**400, "inf"), (Decimal("sNaN"), "nan")):  # no float holds them
        with pytest.warns(RuntimeWarning, match="non-finite reward"):
            _, score, terminated, _, info = stepped(reward)
        assert score == 0.0 and terminated and f"non-finite reward ({shown})" in info["reward_errors"]["env"]
    assert stepped(1)[1] == 1.0  # a real number of any kind is a reward


def test_an_openenv_servers_reward_is_checked_naming_the_server() -> None:
    """A stub server's answers, read by openenv-core's own parser. Before: "0.5" (a step's or a tool call's) trained as
    0.5, done "false" ended the episode."""
    pytest.importorskip("openenv")
    from openenv.core import GenericEnvClient
    from openenv.core.sync_client import SyncEnvClient

    from grpo_gym.interop.openenv import OpenEnvTextEnv, openenv_env

    class Stub(SyncEnvClient):
        """A session whose answers to the steps (tool calls included) are ``answers``, in turn."""

        def __init__(self, *answers: dict[str, Any]) -> None:
            super().__init__(GenericEnvClient(base_url="http://stub.invalid:8000"))
            self.answers = list(answers)

        def connect(self) -> Stub:
            return self

        def reset(self, **kwargs: Any) -> Any:
            return self.async_client._parse_result({"observation": {"message": "Say hi"}, "done": False})

        def step(self, action: Any, **kwargs: Any) -> Any:
            return self.async_client._parse_result(self.answers.pop(0))

        def close(self) -> None:
            pass

    server = "the OpenEnv server at ws://stub.invalid:8000/ws"
    session = OpenEnvTextEnv(Stub({"reward": "0.5", "done": True}))
    session.reset(seed=0)
    with pytest.raises(ReturnTypeError, match=rf"{server} answered step with the reward '0.5' \(str\), not a number"):
        session.step({"message": "hi"})
    session = OpenEnvTextEnv(Stub({"reward": "1", "observation": {"result": "5"}}, {"reward": 1.0, "done": True}))
    session.reset(seed=0)
    session.call_tool("add", {"a": 2, "b": 3})  # the tool's result reaches the model; its reward is the step's
    with pytest.raises(ReturnTypeError, match=rf"{server} answered call_tool with the reward '1' \(str\)"):
        session.step({"message": "hi"})
    session = OpenEnvTextEnv(Stub({"reward": 1.0, "done": "false"}))
    session.reset(seed=0)
    with pytest.raises(ReturnTypeError, match=rf"{server}: step's done returned 'false' \(str\), not True or False"):
        session.step({"message": "hi"})
    for reward in (float("inf"), -(10**400)):  # JSON's 1e999 reads as inf, and 10**400 as an int no float holds
        env = openenv_env(Stub({"reward": reward, "done": True}), tools=False, max_new_tokens=8, context_length=128)
        env.reset(seed=0)
        with pytest.warns(RuntimeWarning, match="non-finite reward"):
            _, score, terminated, _, info = env.step(env.encode_action("hi"))
        assert score == 0.0 and terminated and "non-finite reward (" in info["reward_errors"]["env"]
    env = openenv_env(Stub({"reward": None, "done": True}), tools=False, max_new_tokens=8, context_length=128)
    env.reset(seed=0)
    assert env.step(env.encode_action("hi"))[1] == 0.0  # no reward: 0, as before


# ---------------------------------------------------------------------------------------------- saved env states


def played() -> R1ZeroEnv:
    env = R1ZeroEnv(**ENV_KWARGS)
    env.reset(seed=0)
    return env


def without(state: dict[str, Any], *path: str) -> dict[str, Any]:
    """A copy of ``state`` without ``state[path[0]][path[1]]...``."""
    state = json.loads(json.dumps(state))
    holder = state
    for key in path[:-1]:
        holder = holder[key]
    del holder[path[-1]]
    return state


@pytest.mark.parametrize(
    "path",
    [
        ("task",),  # the task's sampler state: None (a fresh sampler) before
        ("episode",),  # the episode in progress: None (lost) before
        ("reward_error_counts",),  # the counts: left as they were before
        ("warned",),  # warned again
        ("warned", "prompt_cut"),
        ("reward_error_counts", "task"),  # one component's count: left as it was before
        ("reward_weights", "syntax"),  # one weight: left as it was before
        ("episode", "steps"),  # added in this format: the steps were taken to be the turns before
        ("episode", "ended"),  # added in this format: an ended episode could be stepped (scored) again before
        ("episode", "tools"),
    ],
    ids=lambda path: ".".join(path),
)
def test_a_state_of_the_current_format_that_lacks_a_field_is_refused_naming_it(path: tuple[str, ...]) -> None:
    source, env = played(), R1ZeroEnv(**ENV_KWARGS)
    env.reset(seed=1)
    before = env.get_state()
    assert source.get_state()["format"] == STATE_FORMAT == "grpo-gym-env-state/2"
    field = "state" + "".join(f"[{key!r}]" for key in path)
    with pytest.raises(ValueError, match=rf"lacks {re.escape(field)}, which every state of format") as refusal:
        env.set_state(without(source.get_state(), *path))
    assert "use another save" in str(refusal.value)
    assert env.get_state() == before  # nothing applied


def test_an_earlier_formats_state_takes_the_fields_added_since_with_a_warning() -> None:
    source = played()
    source.step(source.encode_action("<think>x</think><answer>-999</answer>"))  # ended (terminated) at step 1
    old = without(without(source.get_state(), "episode", "steps"), "episode", "ended")
    old["format"] = "grpo-gym-env-state/1"
    assert "grpo-gym-env-state/1" in OLDER_STATE_FORMATS
    env = R1ZeroEnv(**ENV_KWARGS)
    lacks = (
        r"records no state\['episode'\]\['steps'\] \(default its turns\), state\['episode'\]\['ended'\] \(default None"
    )
    with pytest.warns(UserWarning, match=r"format 'grpo-gym-env-state/1'\) and " + lacks):
        env.set_state(old)
    assert env.get_state()["episode"]["steps"] == 1 and env.get_state()["episode"]["ended"] is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a state of the format that has every field: no word
        R1ZeroEnv(**ENV_KWARGS).set_state(source.get_state())
    old_without_task = without(old, "task")  # a field every /1 state held: refused there too
    with pytest.raises(ValueError, match=r"lacks state\['task'\], which every state of format 'grpo-gym-env-state/1'"):
        R1ZeroEnv(**ENV_KWARGS).set_state(old_without_task)


def test_a_model_file_whose_env_state_lacks_a_field_is_refused_naming_it(saved: Path, tmp_path: Path) -> None:  # noqa: F811
    path = with_data(saved, tmp_path / "lacks.zip", lambda data: data["state"]["env_states"][0].pop("warned"))
    with pytest.raises(ValueError, match=r"lacks.zip: the run state's 'env_states'\[0\] does not fit the env .*lacks "
                                         r"state\['warned'\], which every state of format") as refusal:  # fmt: skip
        GRPO.load(path)  # the env its record rebuilds (an env given is checked when learn starts)
    assert "use another save" in str(refusal.value)


# ---------------------------------------------------------------------------------------------- skipped steps


def test_steps_skipped_for_non_finite_gradients_are_warned_of_once() -> None:
    """Before: every step of the run was skipped, and only ``train/skipped_steps`` said so."""

    def huge(completions: list[str], **kwargs: Any) -> list[float]:
        return [1e30 if i % 2 else -1e30 for i in range(len(completions))]

    env = gym.make("R1Zero-v0", reward_funcs=[huge], reward_weights={"syntax": 0, "consistency": 0, "task": 0},
                   **ENV_KWARGS)  # fmt: skip
    model = GRPO("TransformerPolicy", env, n_groups=1, group_size=2, cold_start=False, seed=0, policy_kwargs=TINY,
                 advantage_scale="none")  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(4)
    skipped = [str(w.message) for w in caught if "optimizer step was skipped" in str(w.message)]
    assert len(skipped) == 1 and model._skipped_steps == 2 and model._n_updates == 0  # warned once; skipped as before
    assert skipped[0].startswith("iteration 1: an optimizer step was skipped, its gradients were not finite")
    assert "advantage_scale='group'" in skipped[0] and "scale the rewards down" in skipped[0]
    assert "lower learning_rate" in skipped[0]
    assert next(w for w in caught if "optimizer step was skipped" in str(w.message)).category is UserWarning
