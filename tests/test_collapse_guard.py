"""The collapse guard (algorithms/common/collapse_guard.py): its rule on hand-made figures, the restore inside
``learn()`` (weights, optimizer state, learning rate, the skipped update, the logs), an EvalCallback as its signal,
exact resume, and its arguments."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from algorithms import GRPO, LMPPO
from algorithms.common.collapse_guard import CollapseGuard, GuardSettings
from tests.test_grpo import make_env, make_model, parameters


def toy() -> tuple[th.nn.Module, th.optim.Optimizer]:
    net = th.nn.Linear(3, 2)
    return net, th.optim.AdamW(net.parameters(), lr=0.1)


def step(net: th.nn.Module, optimizer: th.optim.Optimizer) -> None:
    optimizer.zero_grad()
    net(th.ones(1, 3)).sum().backward()
    optimizer.step()


def test_the_rule_on_hand_made_figures():
    """window 2, margin 0.1, patience 2: the best mean is 0.8 (iteration 3); means of 0.65 and 0.5 are two checks below
    0.7 in a row, so at iteration 5 the guard restores iteration 3's weights and optimizer state and halves the
    learning rate; its signal then starts again from an empty window."""
    net, optimizer = toy()
    guard = CollapseGuard(GuardSettings(margin=0.1, patience=2, window=2))
    figures = {1: 0.6, 2: 0.8, 3: 0.8, 4: 0.5, 5: 0.5}
    kept = None
    for iteration, figure in figures.items():
        restored = guard.check(figure, iteration, net, optimizer)
        if iteration == 3:
            kept = (
                [p.detach().clone() for p in net.parameters()],
                optimizer.state_dict()["state"][0]["exp_avg"].clone(),
            )
        assert restored == (iteration == 5), iteration
        if not restored:
            step(net, optimizer)
    assert guard.best == pytest.approx(0.8) and guard.best_iteration == 3
    assert all(th.equal(a, b) for a, b in zip(kept[0], net.parameters(), strict=True))
    assert th.equal(optimizer.state_dict()["state"][0]["exp_avg"], kept[1])
    assert guard.restores == 1 and guard.lr_scale == 0.5 and guard.recent == []
    assert guard.events == [{"iteration": 5, "success": 0.5, "best": 0.8, "best_iteration": 3, "lr_scale": 0.5}]
    assert "restored the weights and optimizer state of iteration 3" in guard.describe_last_event(0.05)


def test_a_dip_shorter_than_the_patience_and_a_drop_within_the_margin_do_nothing():
    net, optimizer = toy()
    guard = CollapseGuard(GuardSettings(margin=0.2, patience=3, window=1))
    for iteration, figure in enumerate([0.9, 0.5, 0.5, 0.9, 0.75, 0.75, 0.75, 0.75, 0.1, 0.1]):
        assert not guard.check(figure, iteration, net, optimizer)
    assert guard.restores == 0 and guard.below == 2


def test_after_max_restores_the_guard_only_watches():
    net, optimizer = toy()
    guard = CollapseGuard(GuardSettings(margin=0.1, patience=1, window=1, max_restores=2, lr_factor=0.25))
    restored = [guard.check(figure, i, net, optimizer) for i, figure in enumerate([0.9, 0.1, 0.1, 0.1, 0.1])]
    assert restored == [False, True, True, False, False]
    assert guard.restores == 2 and guard.lr_scale == pytest.approx(0.0625)


def test_the_state_round_trips_with_its_snapshot():
    net, optimizer = toy()
    guard = CollapseGuard(GuardSettings(window=1, patience=1))
    guard.check(0.9, 0, net, optimizer)
    step(net, optimizer)
    guard.check(0.1, 1, net, optimizer)  # restores
    data, tensors = guard.get_state()
    back = CollapseGuard.from_state(data, tensors)
    assert back.get_state()[0] == data
    assert all(th.equal(back.snapshot.weights[k], v) for k, v in guard.snapshot.weights.items())
    step(net, optimizer)
    back.snapshot.restore(net.named_parameters(), optimizer)  # the restored snapshot is a working one
    assert th.equal(net.weight, guard.snapshot.weights["weight"])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("yes", "collapse_guard must be 'auto', True"),
        ({"margins": 0.1}, r"unknown: \['margins'\]"),
        ({"margin": 0.0}, "margin must be a number in"),
        ({"patience": 0}, "patience must be an integer >= 1"),
        ({"window": 2.5}, "window must be an integer"),
        ({"monitor": "validation"}, "monitor must be one of"),
    ],
)
def test_bad_settings_are_refused_at_construction(value, message):
    with pytest.raises(ValueError, match=message):
        make_model(collapse_guard=value)


def scripted(model: GRPO, figures: dict[int, float]) -> None:
    """The guard's figure at iteration t is ``figures[t]`` (1.0 elsewhere): the loop's reaction, without a collapse."""
    model._guard_figure = lambda callback: figures.get(model._iteration, 1.0)  # type: ignore[method-assign]


class Weights(BaseCallback):
    """The policy's weights and optimizer moments at the end of each iteration's update (its next rollout start)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, tuple[list[th.Tensor], int]] = {}

    def _on_rollout_start(self) -> None:
        self.seen[self.model._iteration] = (parameters(self.model), self.model._n_updates)

    def _on_step(self) -> bool:
        return True


def test_learn_restores_the_best_weights_halves_the_rate_and_logs_it(tmp_path: Path, capsys):
    settings = {"margin": 0.1, "patience": 2, "window": 1, "monitor": "rollout"}
    model = make_model(collapse_guard=settings, cold_start=False, tensorboard_log=str(tmp_path), verbose=1,
                       learning_rate=1e-3)  # fmt: skip
    scripted(model, {1: 0.5, 2: 0.9, 3: 0.5, 4: 0.5})  # best at iteration 2, restored at iteration 4
    watch = Weights()
    model.learn(8 * 6, callback=watch)
    # the guard judges iteration t after its rollout, sampled by the weights after t - 1 updates (watch.seen[t - 1])
    best_weights, _ = watch.seen[1]
    after_restore, updates = watch.seen[4]
    assert all(th.equal(a, b) for a, b in zip(best_weights, after_restore, strict=True))
    assert updates == 3  # iteration 4's update was skipped
    assert model._n_updates == 5 and model._guard.restores == 1
    assert model.policy.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4)
    assert "collapse guard: rollout success 0.500" in capsys.readouterr().out
    events = EventAccumulator(str(tmp_path / "GRPO_1")).Reload()
    assert [e.value for e in events.Scalars("guard/restores")] == [0, 0, 0, 1, 1, 1]
    assert [e.value for e in events.Scalars("guard/lr_scale")][-1] == 0.5
    assert events.Scalars("train/learning_rate")[-1].value == pytest.approx(5e-4)


def test_resume_with_the_guard_is_exact(tmp_path: Path):
    """learn(6 iterations) equals learn(3); save; load; learn(3) with a restore in the second half."""
    settings = {"margin": 0.1, "patience": 1, "window": 1, "monitor": "rollout"}
    figures = {1: 0.5, 2: 0.9, 3: 0.6, 4: 0.2, 5: 0.9}
    whole = make_model(collapse_guard=settings, cold_start=False, learning_rate=1e-3)
    scripted(whole, figures)
    whole.learn(8 * 6)
    first = make_model(collapse_guard=settings, cold_start=False, learning_rate=1e-3)
    scripted(first, figures)
    first.learn(8 * 3)
    first.save(tmp_path / "half")
    second = GRPO.load(tmp_path / "half", env=make_env())
    scripted(second, figures)
    second.learn(8 * 3, reset_num_timesteps=False)
    assert whole._guard.restores == second._guard.restores == 2  # iterations 3 and 4, after the best at 2
    assert whole._guard.get_state()[0] == second._guard.get_state()[0]
    assert all(th.equal(a, b) for a, b in zip(parameters(whole), parameters(second), strict=True))


def test_the_default_signal_is_greedy_success_on_fixed_held_out_problems(monkeypatch):
    """Every ``eval_every`` iterations, the same ``eval_problems`` problems (seeded apart from a final evaluation's)
    answered greedily; nothing in between."""
    from algorithms.common import evaluation
    from algorithms.common.evaluation import held_out_problems

    model = make_model(collapse_guard={"eval_every": 2, "eval_problems": 4}, cold_start=False)
    assert model._guard.settings.monitor == "held_out"
    seen = []
    evaluate = evaluation.evaluate_problems

    def watched(policy, env, problems, seed=0, greedy=False):
        seen.append((model._iteration, [p.prompt for p in problems], greedy))
        return evaluate(policy, env, problems, seed, greedy)

    monkeypatch.setattr("algorithms.common.collapse_guard.evaluate_problems", watched)
    model.learn(8 * 5)
    assert [iteration for iteration, _, _ in seen] == [2, 4] and all(greedy for *_, greedy in seen)
    assert seen[0][1] == seen[1][1] and len(seen[0][1]) == 4
    final = held_out_problems(model.env, 4, model.env.get_attr("difficulty", indices=[0])[0])
    assert not set(seen[0][1]) & {p.prompt for p in final}
    assert model._guard.best is not None and model._guard.recent


def test_an_eval_callback_can_be_the_signal(tmp_path: Path):
    model = make_model(collapse_guard={"monitor": "eval", "patience": 1}, cold_start=False)
    evaluator = EvalCallback(make_env(), n_eval_episodes=2, eval_freq=8, verbose=0)
    model.learn(8 * 3, callback=evaluator)
    assert model._guard.evaluations_seen == 3  # one evaluation per iteration (8 steps)
    assert model._guard.best is not None
    with pytest.raises(ValueError, match="pass one to learn"):
        make_model(collapse_guard={"monitor": "eval"}, cold_start=False).learn(8)


def test_lmppo_takes_the_guard_too():
    tiny = {"model": "tiny", "model_kwargs": {"num_hidden_layers": 1}}
    model = LMPPO("TransformerPolicy", make_env(), n_groups=2, group_size=4, cold_start=False, seed=0,
                  policy_kwargs=tiny, collapse_guard=True)  # fmt: skip
    assert model._guard is not None and model._guard.settings == GuardSettings()
    model.learn(8)


def test_auto_guards_a_pretrained_start_and_not_the_built_in_model(tmp_path: Path, capsys):
    """``collapse_guard="auto"`` (the default): off for the built-in model, on (its defaults) for a model loaded from
    a folder on a task with held-out problems; ``False`` turns it off there."""
    built_in = make_model(cold_start=False)
    assert built_in.collapse_guard == "auto" and built_in._guard is None
    built_in.policy.save_pretrained(tmp_path / "start", built_in.env.get_attr("tokenizer", indices=[0])[0])
    pretrained = {"model": str(tmp_path / "start")}
    model = make_model(policy_kwargs=pretrained, verbose=1)
    assert model._guard is not None and model._guard.settings == GuardSettings()
    assert "collapse guard on (collapse_guard='auto'" in capsys.readouterr().out
    model.learn(8 * 5)
    assert model._guard.best is not None  # the held-out check of iteration 5
    assert make_model(policy_kwargs=pretrained, collapse_guard=False)._guard is None
