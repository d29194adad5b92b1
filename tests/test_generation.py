"""Tests of algorithms.common.generation.sampler: sampling with a KV cache, completion log-probs, and a token's
log-prob and the entropy by hand."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from algorithms.common.generation.completion_pass import completion_log_probs
from algorithms.common.generation.sampler import entropy_of, log_probs_of, position_ids_from_mask, sample
from algorithms.common.model.loading import load_model
from grpo_gym.tokenizer import BUILTIN_VOCAB_SIZE, build_char_tokenizer

PAD, EOS = 0, 1
PROMPTS = ["2+3=", "Solve: 17*4", "hi", "<think>What is 9-2?</think><answer>", "x"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0).eval()


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    """A tiny Qwen2 saved and read back through ``load_model(path)``, as a user's checkpoint would be."""
    config = Qwen2Config(
        vocab_size=112, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=PAD, eos_token_id=EOS,
    )  # fmt: skip
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qwen2")
    Qwen2ForCausalLM(config).save_pretrained(path)
    return load_model(path).eval()


@pytest.fixture(scope="module")
def gpt2():
    config = GPT2Config(vocab_size=103, n_embd=32, n_layer=2, n_head=4, n_positions=256, bos_token_id=EOS,
                        eos_token_id=EOS, pad_token_id=PAD)  # fmt: skip
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


def batch(tokenizer, prompts=PROMPTS):
    encoded = tokenizer(prompts, padding=True, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"]


def draw(model, ids, mask, seed=0, **kwargs):
    kwargs = {"max_new_tokens": 12, "eos_token_id": EOS, "pad_token_id": PAD, **kwargs}
    return sample(model, ids, mask, generator=torch.Generator().manual_seed(seed), **kwargs)


@pytest.mark.parametrize("name", ["tiny", "qwen2", "gpt2"])
def test_sampled_log_probs_equal_recomputed(request, tokenizer, name):
    """INVARIANT: on-policy, the update's forward pass gives back the sampling log-probs (ratio = 1)."""
    model = request.getfixturevalue(name)
    ids, mask = batch(tokenizer)
    assert len(set(mask.sum(-1).tolist())) > 1  # prompts of different lengths, left-padded
    eos = list(range(3, 23))  # frequent enough that rows end at different steps
    out = draw(model, ids, mask, eos_token_id=eos, temperature=0.7, top_p=0.8, top_k=50, vocab_size=103)
    assert out.lengths.min() < 12 and not out.mask.all()
    log_probs, entropy = completion_log_probs(
        model, ids, mask, out.tokens, out.mask, temperature=0.7, vocab_size=103, with_entropy=True
    )
    torch.testing.assert_close(log_probs, out.log_probs, atol=1e-5, rtol=0)
    assert (entropy[out.mask] > 0).all() and (entropy[~out.mask] == 0).all()


def test_eos_padding_mask_and_lengths(tiny, tokenizer):
    ids, mask = batch(tokenizer, PROMPTS * 4)
    eos = list(range(3, 23))
    out = draw(tiny, ids, mask, eos_token_id=eos, temperature=1.5, top_p=1.0)
    assert out.tokens.shape == out.log_probs.shape == out.mask.shape == (20, 12)
    is_eos = torch.isin(out.tokens, torch.tensor(eos)) & out.mask
    for row in range(20):
        hits = is_eos[row].nonzero().flatten()
        length = int(hits[0]) + 1 if len(hits) else 12
        assert out.lengths[row] == length
        assert out.mask[row, :length].all() and not out.mask[row, length:].any()
        assert (out.tokens[row, length:] == PAD).all() and (out.log_probs[row, length:] == 0).all()
        assert (out.log_probs[row, :length] < 0).all()
    assert len(set(out.lengths.tolist())) > 2


def test_stops_early_when_all_rows_are_done(tiny, tokenizer):
    ids, mask = batch(tokenizer)
    everything = list(range(BUILTIN_VOCAB_SIZE))  # every id ends the completion: one token per row
    out = draw(tiny, ids, mask, eos_token_id=everything)
    assert out.lengths.tolist() == [1] * len(PROMPTS)
    assert out.tokens.shape == (len(PROMPTS), 12) and (out.tokens[:, 1:] == PAD).all()
    empty = draw(tiny, ids, mask, max_new_tokens=0)
    assert empty.tokens.shape == (len(PROMPTS), 0) and empty.lengths.tolist() == [0] * len(PROMPTS)


def test_same_seed_same_tokens(tiny, tokenizer):
    ids, mask = batch(tokenizer)
    first, second = draw(tiny, ids, mask, seed=5), draw(tiny, ids, mask, seed=5)
    assert torch.equal(first.tokens, second.tokens) and torch.equal(first.log_probs, second.log_probs)
    assert not torch.equal(first.tokens, draw(tiny, ids, mask, seed=6).tokens)


@pytest.mark.parametrize("name", ["tiny", "qwen2"])
def test_greedy_equals_hf_generate(request, tokenizer, name):
    model = request.getfixturevalue(name)
    ids, mask = batch(tokenizer)
    ours = sample(model, ids, mask, max_new_tokens=16, eos_token_id=EOS, pad_token_id=PAD, greedy=True)
    eos = int(ours.tokens[0, 5])  # an id greedy emits in row 0: that row ends early in both
    for eos_id in (EOS, eos):
        ours = sample(model, ids, mask, max_new_tokens=16, eos_token_id=eos_id, pad_token_id=PAD, greedy=True)
        theirs = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=16, do_sample=False, eos_token_id=eos_id,
            pad_token_id=PAD, top_p=None, top_k=None, temperature=None,
        )[:, ids.shape[1] :]  # fmt: skip
        assert torch.equal(ours.tokens[:, : theirs.shape[1]], theirs)
        assert (ours.tokens[:, theirs.shape[1] :] == PAD).all()
    assert ours.lengths[0] <= 6


def test_prompt_padding_does_not_change_results(tiny):
    generator = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 103, (1, 9), generator=generator)
    junk = torch.randint(0, 103, (1, 5), generator=generator)  # padding ids are ignored, whatever they are
    padded = torch.cat([junk, prompt], dim=1)
    padded_mask = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 9, dtype=torch.long)], dim=1)
    kwargs = {"temperature": 0.8, "top_p": 0.92, "max_new_tokens": 16}
    plain = draw(tiny, prompt, torch.ones_like(prompt), seed=11, **kwargs)
    shifted = draw(tiny, padded, padded_mask, seed=11, **kwargs)
    tokens, done = shifted.tokens, shifted.mask
    assert torch.equal(plain.tokens, shifted.tokens)
    torch.testing.assert_close(plain.log_probs, shifted.log_probs, atol=1e-5, rtol=0)
    recomputed, _ = completion_log_probs(tiny, padded, padded_mask, tokens, done, temperature=0.8)
    torch.testing.assert_close(recomputed, plain.log_probs, atol=1e-5, rtol=0)
    assert position_ids_from_mask(padded_mask).tolist() == [[0] * 6 + list(range(1, 9))]


def test_vocab_size_masks_ids(tiny, tokenizer):
    ids, mask = batch(tokenizer, PROMPTS * 8)
    out = draw(tiny, ids, mask, vocab_size=20, temperature=3.0, top_p=1.0, eos_token_id=-1)
    assert out.tokens.max() < 20 and len(out.tokens.unique()) > 10
    recomputed, _ = completion_log_probs(tiny, ids, mask, out.tokens, out.mask, temperature=3, vocab_size=20)
    torch.testing.assert_close(recomputed, out.log_probs, atol=1e-5, rtol=0)
    with torch.no_grad():  # normalised over the 20 allowed ids only
        logits = tiny(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    expected = torch.log_softmax(logits[:, -1, :20] / 3.0, -1).gather(-1, out.tokens[:, :1]).squeeze(-1)
    torch.testing.assert_close(out.log_probs[:, 0], expected, atol=1e-5, rtol=0)


def test_tiny_top_p_is_greedy(tiny, tokenizer):
    ids, mask = batch(tokenizer)
    nucleus = draw(tiny, ids, mask, top_p=1e-6, temperature=0.9, max_new_tokens=16)
    greedy = draw(tiny, ids, mask, greedy=True, temperature=0.9, max_new_tokens=16)
    assert torch.equal(nucleus.tokens, greedy.tokens)
    torch.testing.assert_close(nucleus.log_probs, greedy.log_probs, atol=1e-6, rtol=0)


def _reference_first_token_probs(model, ids, temperature, top_p, top_k):
    """Independent nucleus/top-k reference: sort, keep, renormalise (float64)."""
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1].double() / temperature
    probs = torch.softmax(logits, -1)
    order = probs.argsort(descending=True).tolist()
    kept, mass = [], 0.0
    for rank, index in enumerate(order):
        if (top_k and rank >= top_k) or mass >= top_p:
            break
        kept.append(index)
        mass += float(probs[index])
    expected = torch.zeros_like(probs)
    expected[kept] = probs[kept] / probs[kept].sum()
    return expected


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), [(1.0, 1.0, 0), (0.15, 0.9, 0), (0.5, 1.0, 6)])
def test_first_token_distribution_matches_softmax(tiny, temperature, top_p, top_k):
    rows = 4000
    ids = torch.tensor([[50, 51, 52, 53, 54, 55]])
    expected = _reference_first_token_probs(tiny, ids, temperature, top_p, top_k)
    out = draw(tiny, ids.expand(rows, -1), torch.ones(rows, 6, dtype=torch.long), seed=0,
               max_new_tokens=1, temperature=temperature, top_p=top_p, top_k=top_k)  # fmt: skip
    empirical = torch.bincount(out.tokens[:, 0], minlength=BUILTIN_VOCAB_SIZE).double() / rows
    assert (empirical[expected == 0] == 0).all()  # nothing outside the nucleus / top-k
    support = expected > 0
    # chi-square goodness of fit; df + 6 sqrt(2 df) is far in the tail (p << 1e-4)
    chi2 = float((((empirical - expected) ** 2)[support] / expected[support]).sum() * rows)
    df = int(support.sum()) - 1
    assert chi2 < df + 6 * (2 * df) ** 0.5
    if df < 30:  # few categories: the total variation is small too
        assert 0.5 * (empirical - expected).abs().sum() < 0.05


def _exact_pair_probs(model, ids, vocab, top_p, eos):
    """Exact probability of every 2-token completion ``(a, b)`` (float64), with EOS ending after ``a``."""
    with torch.no_grad():
        first = model(input_ids=ids).logits[0, -1, :vocab].double()
        nexts = model(input_ids=torch.cat([ids.expand(vocab, -1), torch.arange(vocab)[:, None]], 1)).logits
    expected = torch.zeros(vocab, vocab + 1, dtype=torch.float64)  # column `vocab`: the completion ended at a
    p_first = _nucleus(first, top_p)
    for a in range(vocab):
        if a == eos:
            expected[a, vocab] = p_first[a]
        elif a != PAD:
            expected[a, :vocab] = p_first[a] * _nucleus(nexts[a, -1, :vocab].double(), top_p)
    return expected


def _nucleus(logits, top_p):
    logits = logits.clone()
    logits[PAD] = -torch.inf  # never drawn
    probs = torch.softmax(logits, -1)
    ordered, order = probs.sort(descending=True)
    keep = order[(ordered.cumsum(0) - ordered) < top_p]
    out = torch.zeros_like(probs)
    out[keep] = probs[keep] / probs[keep].sum()
    return out


@pytest.mark.parametrize("decoder", ["llama", "hf"])
@pytest.mark.parametrize("top_p", [1.0, 0.7])
def test_two_token_completions_follow_the_model(tiny, decoder, top_p):
    """The joint law of whole completions (not just the first token) is the model's: one shared prompt for all
    rows (its cache is shared) and an EOS that ends some rows after one token (they are dropped from the batch)."""
    rows, vocab, eos = 6000, 8, 3
    ids = torch.tensor([[50, 51, 52, 53]])
    expected = _exact_pair_probs(tiny, ids, vocab, top_p, eos).flatten()
    out = draw(tiny, ids.expand(rows, -1), torch.ones(rows, 4, dtype=torch.long), max_new_tokens=2,
               eos_token_id=eos, vocab_size=vocab, top_p=top_p, decoder=decoder)  # fmt: skip
    second = torch.where(out.mask[:, 1], out.tokens[:, 1], vocab)
    empirical = torch.bincount(out.tokens[:, 0] * (vocab + 1) + second, minlength=len(expected)).double() / rows
    assert (empirical[expected == 0] == 0).all()
    support = expected > 0
    chi2 = float((((empirical - expected) ** 2)[support] / expected[support]).sum() * rows)
    df = int(support.sum()) - 1
    assert chi2 < df + 6 * (2 * df) ** 0.5, (chi2, df)


def test_decoders_draw_the_same_tokens(tiny, qwen2, tokenizer):
    """The Llama-family decoder and the model's own forward give the same tokens at a fixed seed, whatever the
    prompt sharing and row dropping: a row's noise is its own."""
    ids, mask = batch(tokenizer, PROMPTS * 3)  # repeated prompts: shared prefill
    eos = list(range(3, 12))
    for model in (tiny, qwen2):
        runs = [
            draw(model, ids, mask, eos_token_id=eos, vocab_size=103, decoder=decoder, compact_below=compact)
            for decoder, compact in [("hf", 0.0), ("llama", 0.75), ("llama", 1.0), ("hf", 1.0)]
        ]
        assert runs[0].lengths.min() < 12 < runs[0].lengths.max() + 1  # some rows end early, some run on
        for run in runs[1:]:
            assert torch.equal(run.tokens, runs[0].tokens)
            torch.testing.assert_close(run.log_probs, runs[0].log_probs, atol=1e-5, rtol=0)


def test_llama_decoder_applies_only_to_llama_family(tiny, qwen2, gpt2):
    from algorithms.common.generation.decoders import HFDecoder, LlamaDecoder, make_decoder

    assert isinstance(make_decoder(tiny, 8), LlamaDecoder) and isinstance(make_decoder(qwen2, 8), LlamaDecoder)
    assert isinstance(make_decoder(gpt2, 8), HFDecoder) and isinstance(make_decoder(tiny, 8, "hf"), HFDecoder)
    with pytest.raises(ValueError, match="Llama-family"):
        make_decoder(gpt2, 8, "llama")
    with pytest.raises(ValueError, match="decoder must be"):
        make_decoder(tiny, 8, "fast")


def test_entropy_and_log_probs_by_hand(tiny):
    prompt, completion = torch.tensor([[40, 41, 42]]), torch.tensor([[43, 44, 45]])
    completion_mask = torch.tensor([[True, True, False]])
    with torch.no_grad():
        log_probs, entropy = completion_log_probs(
            tiny, prompt, torch.ones_like(prompt), completion, completion_mask,
            temperature=0.5, vocab_size=60, with_entropy=True,
        )  # fmt: skip
        logits = tiny(input_ids=torch.cat([prompt, completion], 1)).logits[0].double()
    for t in range(2):
        p = torch.softmax(logits[2 + t, :60] / 0.5, -1)
        assert abs(float(entropy[0, t]) - float(-(p * p.log()).sum())) < 1e-5
        assert abs(float(log_probs[0, t]) - float(p[completion[0, t]].log())) < 1e-5
    assert entropy[0, 2] == 0 and log_probs[0, 2] == 0


def test_completion_log_probs_gradients_ignore_padding(tiny, tokenizer):
    ids, mask = batch(tokenizer)
    out = draw(tiny, ids, mask, eos_token_id=list(range(3, 23)))
    log_probs, entropy = completion_log_probs(tiny, ids, mask, out.tokens, out.mask, with_entropy=True)
    (log_probs.sum() + entropy.sum()).backward()
    grads = [p.grad.clone() for p in tiny.parameters()]
    assert all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)
    tiny.zero_grad(set_to_none=True)
    junk = out.tokens.masked_fill(~out.mask, 77)  # other ids after EOS: same values, same gradients
    again, entropy2 = completion_log_probs(tiny, ids, mask, junk, out.mask, with_entropy=True)
    (again.sum() + entropy2.sum()).backward()
    torch.testing.assert_close(again, log_probs, atol=1e-6, rtol=0)
    for p, g in zip(tiny.parameters(), grads, strict=True):
        torch.testing.assert_close(p.grad, g, atol=1e-6, rtol=1e-5)
    tiny.zero_grad(set_to_none=True)


def test_bad_arguments(tiny, tokenizer):
    ids, mask = batch(tokenizer)
    for kwargs in ({"temperature": 0.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}):
        with pytest.raises(ValueError):
            draw(tiny, ids, mask, **kwargs)


def test_pad_is_never_drawn_unless_it_is_an_eos(tiny, tokenizer):
    # make pad (id 0) the most likely token everywhere: it must still never appear inside a completion
    hook = tiny.get_output_embeddings().register_forward_hook(
        lambda module, inputs, out: out + 20.0 * (torch.arange(out.shape[-1]) == 0)
    )
    try:
        ids = torch.tensor([[5, 6, 7]] * 16)
        out = sample(
            tiny,
            ids,
            torch.ones_like(ids),
            max_new_tokens=12,
            eos_token_id=1,
            pad_token_id=0,
            generator=torch.Generator().manual_seed(0),
        )
        assert not ((out.tokens == 0) & out.mask).any()
        assert out.lengths.min() > 0
        # pad that is also an EOS id is a legitimate stop
        stop = sample(
            tiny,
            ids,
            torch.ones_like(ids),
            max_new_tokens=12,
            eos_token_id=[1, 0],
            pad_token_id=0,
            generator=torch.Generator().manual_seed(0),
        )
        assert (stop.lengths == 1).all() and (stop.tokens[:, 0] == 0).all()
    finally:
        hook.remove()


@pytest.mark.parametrize("name", ["tiny", "qwen2", "gpt2"])
def test_hidden_states_come_from_the_same_forward_in_both_layouts(request, tokenizer, name):
    model = request.getfixturevalue(name)
    vocab = model.get_input_embeddings().num_embeddings
    ids, mask = batch(tokenizer)
    ids = ids % vocab
    out = draw(model, ids, mask, vocab_size=vocab, eos_token_id=list(range(3, 23)))
    with torch.no_grad():
        plain = completion_log_probs(model, ids, mask, out.tokens, out.mask, vocab_size=vocab)
        settings = {"vocab_size": vocab, "with_hidden": True}
        results = {
            layout: completion_log_probs(model, ids, mask, out.tokens, out.mask, layout=layout, **settings)
            for layout in ("padded", "packed")
        }
        # the hidden state that predicts completion token t of row 0, read from the model itself
        attention = torch.cat([mask, out.mask.long()], 1)
        states = model(
            input_ids=torch.cat([ids, out.tokens], 1),
            attention_mask=attention,
            position_ids=position_ids_from_mask(attention),
            output_hidden_states=True,
        ).hidden_states[-1]
    width = ids.shape[1]
    for layout, (log_probs, entropy, hidden) in results.items():
        assert entropy is None and hidden.shape == (*out.tokens.shape, states.shape[-1]), layout
        torch.testing.assert_close(log_probs, plain[0], atol=1e-5, rtol=0)
        assert bool((hidden[~out.mask] == 0).all())
        n = int(out.mask[0].sum())
        torch.testing.assert_close(hidden[0, :n], states[0, width - 1 : width - 1 + n], atol=1e-4, rtol=1e-4)


def test_the_nucleus_among_the_top_ids_draws_what_the_sort_draws():
    """``_draw_nucleus`` (the nucleus looked for among the most likely ids) picks the token ``_draw(_filtered(...))``
    picks from the same noise, for peaked rows (nucleus among the candidates) and flat ones (the sorting way)."""
    from algorithms.common.generation.sampler import NUCLEUS_CANDIDATES, _draw, _draw_nucleus, _filtered

    generator = torch.Generator().manual_seed(0)
    vocab = 5000
    peaked = torch.randn((64, vocab), generator=generator) * 8  # nuclei of a few ids
    flat = torch.randn((8, vocab), generator=generator) * 0.01  # nuclei of thousands of ids
    for logits in (peaked, flat, torch.cat([peaked[:4], flat[:4]])):
        for top_p in (0.5, 0.92, 0.999):
            for _ in range(3):
                uniform = torch.rand(logits.shape, generator=generator)
                expected = _draw(_filtered(logits, top_p, 0), uniform.clone())
                assert torch.equal(_draw_nucleus(logits, top_p, uniform), expected)
    assert NUCLEUS_CANDIDATES < vocab


# the definitions the sampler and the update share: a token's log-prob and the entropy, by hand


def test_log_probs_of_by_hand():
    # logits [0, log 3]: softmax = [1/4, 3/4]
    logits = torch.tensor([[[0.0, math.log(3)], [0.0, math.log(3)]]], dtype=torch.float64)  # (1, 2, 2)
    logp = log_probs_of(logits, torch.tensor([[0, 1]]))
    torch.testing.assert_close(logp, torch.tensor([[math.log(0.25), math.log(0.75)]], dtype=torch.float64))


@pytest.mark.parametrize(
    "logits, expected",
    [
        ([0.0, 0.0, 0.0, 0.0], math.log(4)),  # uniform over 4: log 4 = 1.386294
        ([0.0, math.log(3)], -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))),  # 0.562335
        ([100.0, 0.0], 0.0),  # nearly deterministic: about 100 e^-100, i.e. 0
    ],
)
def test_entropy_of_by_hand(logits, expected):
    logits = torch.tensor([[logits]], dtype=torch.float64, requires_grad=True)  # (1, 1, V)
    entropy = entropy_of(logits)
    assert entropy.item() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_entropy_of_matches_the_definition_on_random_logits():
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(entropy_of(logits), -(p * p.log()).sum(-1))
