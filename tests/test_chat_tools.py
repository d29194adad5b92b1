# ruff: noqa: E501  (the chat template is kept verbatim, its lines as long as the original's)
"""A Hugging Face chat model whose template renders tools (a Qwen2.5-style template on a byte-level BPE tokenizer
trained here, a Qwen2 network with random weights, saved as a folder) plays tool episodes with its own template:
the schemas in its system message, the parsed call, the result as its tool message; the cold start and GRPO run on
it end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch as th

import grpo_gym
from algorithms import GRPO
from algorithms.common.evaluation import evaluate_problems
from grpo_gym.gold import ENV_TOKEN, answer_text, tool_call_text
from grpo_gym.templates import R1ZERO_INSTRUCTIONS
from grpo_gym.tools import Toolbox

#: Qwen2.5-Instruct's chat template (tools in the system message, each result a <tool_response> in a user turn)
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
ENV = {"template": "r1zero", "tools": ["calculator"], "max_new_tokens": 96, "context_length": 768, "difficulty": 0.5}
CORPUS = [  # what the tokenizer is trained on: the texts of an episode, so that a prompt takes ~100s of tokens
    R1ZERO_INSTRUCTIONS,
    *re.findall(r'"((?:[^"\\]|\\.)*)"', QWEN25_TEMPLATE),  # the template's own texts
    json.dumps(Toolbox(["calculator"]).schemas[0]),
    '<tool_call>{"name": "calculator", "arguments": {"expression": "37+48*2"}}</tool_call>',
    "<think>37+48*2=133</think><answer>133</answer>",
    "<tool_response>\n133\n</tool_response> What is 12 - 7 * 3? 0123456789 + - * / ( ) =",
]


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory) -> Path:
    """The model folder: tokenizer (with the template) and a 2-layer Qwen2 of random weights."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=1000, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(CORPUS * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = QWEN25_TEMPLATE
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
    )  # fmt: skip
    th.manual_seed(0)
    folder = tmp_path_factory.mktemp("qwen25-style")
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_tool_episode_in_the_models_own_template(chat_folder: Path) -> None:
    env = grpo_gym.R1ZeroEnv(**ENV, tokenizer=str(chat_folder))
    _, info = env.reset(seed=0)
    prompt = info["prompt"]
    assert prompt.startswith("<|im_start|>system\nA conversation between User and Assistant")
    assert "# Tools" in prompt and '"name": "calculator"' in prompt and prompt.endswith("<|im_start|>assistant\n")
    calls, reasoning, answer = env.task.tool_solution(env.problem, env.tools.names)
    _, _, terminated, truncated, info = env.step(env.encode_action(tool_call_text(calls)))
    assert not terminated and not truncated
    (call,) = info["tool_calls"]
    assert call["name"] == "calculator" and call["arguments"] == calls[0]["arguments"] and call["result"] == answer
    text = env.tokenizer.decode(env.window.tokens())
    result = (
        f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{answer}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert text.endswith(tool_call_text(calls) + result)  # the tool message in the template's own role and layout
    _, _, terminated, _, info = env.step(env.encode_action(answer_text(reasoning, answer)))
    assert terminated and info["is_success"] and info["turn"] == 2


def test_cold_start_grpo_and_evaluation_on_the_chat_model(chat_folder: Path) -> None:
    from stable_baselines3.common.env_util import make_vec_env

    vec = make_vec_env(grpo_gym.R1ZeroEnv, n_envs=4, env_kwargs={**ENV, "tokenizer": str(chat_folder)}, seed=0)
    env = vec.envs[0].unwrapped
    _, completion, roles = env.gold_examples(2, episodes=True)[0]  # one tool episode: two model turns
    between = env.tokenizer.decode(completion[roles == ENV_TOKEN])
    assert between.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n")  # the template's tool message
    model = GRPO("TransformerPolicy", vec, n_groups=1, group_size=4, cold_start=True, cold_start_kwargs={"steps": 2, "batch_size": 4},  seed=0,
                 policy_kwargs={"model": str(chat_folder)}, mixed_precision="no")  # fmt: skip
    assert type(model.policy.model).__name__ == "Qwen2ForCausalLM"
    model.learn(4)
    assert model._cold_start_done and model.num_timesteps >= 4
    result = evaluate_problems(model.policy, vec, env.eval_problems(4, 0.5))
    assert result.n_problems == 4 and 0.0 <= result.success_rate <= 1.0
