"""LLaDA's ``logits_eos_inf`` and ``confidence_eos_eot_inf`` as its ``generate.py`` computes them.

``ref_generate`` transcribes ML-GSAI/LLaDA ``generate.py`` (cfg 0, ``low_confidence``),
including the two options and the chained assignment
``logits_with_noise[:, :, EOS] = logits[:, :, EOT] = -torch.inf`` (at temperature 0
``add_gumbel_noise`` returns ``logits`` itself, so both ids are -inf in the confidence softmax).
The toy checkpoint's head is biased towards EOS and EoT so that the options change the output.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fixtures.hub_checkpoints import LLADA_SPECIAL, llada_checkpoint
from fair_calib.decoding import generate, make_policy
from fair_calib.decoding.generate import _block_tokens
from fair_calib.models.adapters import load_model

EOS, EOT = LLADA_SPECIAL["<|endoftext|>"], LLADA_SPECIAL["<|eot_id|>"]


def add_gumbel_noise(logits, temperature):
    if temperature == 0:
        return logits
    logits = logits.to(torch.float64)
    noise = torch.rand_like(logits, dtype=torch.float64)
    gumbel_noise = (- torch.log(noise)) ** temperature
    return logits.exp() / gumbel_noise


def ref_generate(model, prompt, steps, gen_length, block_length, mask_id,
                 logits_eos_inf=False, confidence_eos_eot_inf=False):
    """generate.py at temperature 0, cfg 0, low_confidence; the window after every step."""
    history = []
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, :prompt.shape[1]] = prompt.clone()
    num_blocks = gen_length // block_length
    steps = steps // num_blocks
    for num_block in range(num_blocks):
        lo = prompt.shape[1] + num_block * block_length
        block_mask_index = x[:, lo:lo + block_length] == mask_id
        mask_num = block_mask_index.sum(dim=1, keepdim=True)
        num_transfer = torch.zeros(mask_num.size(0), steps, dtype=torch.int64) + mask_num // steps
        for i in range(mask_num.size(0)):
            num_transfer[i, :int(mask_num[i] % steps)] += 1
        for i in range(steps):
            mask_index = x == mask_id
            logits = model(x).logits
            if logits_eos_inf:
                logits[:, :, EOS] = -torch.inf
            logits_with_noise = add_gumbel_noise(logits, temperature=0.0)
            x0 = torch.argmax(logits_with_noise, dim=-1)
            if confidence_eos_eot_inf:
                logits_with_noise[:, :, EOS] = logits[:, :, EOT] = -torch.inf
            p = F.softmax(logits, dim=-1)
            x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
            x0_p[:, lo + block_length:] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -np.inf)
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(confidence.shape[0]):
                _, select = torch.topk(confidence[j], k=int(num_transfer[j, i]))
                transfer[j, select] = True
            x[transfer] = x0[transfer]
            history.append(x[:, prompt.shape[1]:].clone())
    return history


class Steps:
    def start(self, b, k, T):
        self.windows = []

    def step(self, t, logits, masked, committed, window):
        self.windows.append(window.clone().tolist())

    def finish(self, out):
        pass


@pytest.fixture(scope="module")
def eos_heavy(tmp_path_factory):
    """The toy LLaDA checkpoint with a head that likes EOS and EoT (and never the mask)."""
    folder = tmp_path_factory.mktemp("llada") / "m"
    llada_checkpoint(folder)
    lm = load_model(folder, "llada")
    assert lm.eos_eot_ids == (EOS, EOT)           # the adapter's tokens, through the tokenizer
    head = lm.model.lm_head
    with torch.no_grad():
        head.bias = torch.nn.Parameter(torch.zeros(head.out_features))
        head.bias[lm.mask_id] = -30.0
        head.bias[EOS] = 5.0
        head.bias[EOT] = 4.0
    return lm


@pytest.mark.parametrize("eos_inf,conf_inf", [(False, False), (True, False), (False, True),
                                              (True, True)])
@pytest.mark.parametrize("block", [4, 16])
def test_options_equal_generate_py(eos_heavy, eos_inf, conf_inf, block):
    pol = make_policy(eos_heavy, policy="low_confidence", steps=16, gen_length=16,
                      block_length=block, logits_eos_inf=eos_inf, confidence_eos_eot_inf=conf_inf)
    outs = set()
    for seed in range(3):
        prompt = torch.randint(0, 90, (1, 6), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            want = ref_generate(eos_heavy.model, prompt, 16, 16, block, eos_heavy.mask_id,
                                eos_inf, conf_inf)
        rec = Steps()
        generate(eos_heavy, prompt.tolist(), pol, recorder=rec)
        assert rec.windows == [w.tolist() for w in want], seed
        outs.add(str(want[-1].tolist()))
    if eos_inf:
        assert not any(str(EOS) in o.replace("[", " ").replace(",", " ").split() for o in outs)


def test_the_options_change_this_model_s_output(eos_heavy):
    """Not a vacuous comparison: each option changes what this checkpoint decodes."""
    prompt = torch.randint(0, 90, (1, 6), generator=torch.Generator().manual_seed(0)).tolist()
    outs = {}
    for key in ("none", "logits_eos_inf", "confidence_eos_eot_inf"):
        kw = {} if key == "none" else {key: True}
        pol = make_policy(eos_heavy, policy="low_confidence", steps=16, gen_length=16,
                          block_length=16, **kw)
        outs[key] = generate(eos_heavy, prompt, pol).tolist()
    assert outs["none"] != outs["logits_eos_inf"]
    assert outs["none"] != outs["confidence_eos_eot_inf"]


class _Rows:
    """The decoder's batch stand-in for one draw of Gumbel uniforms."""
    def __init__(self, u):
        self.u = u

    def uniform(self, shape):
        return self.u


def test_chained_assignment_at_temperature_above_zero():
    """At temperature > 0 ``logits_with_noise`` is a float64 copy: the confidence softmax sees
    EoT at -inf and EOS as it was; the token choice is the Gumbel-max of the logits."""
    g = torch.Generator().manual_seed(0)
    span = torch.randn(2, 5, 12, generator=g)
    span[..., 3] += 3.0                                     # EOS often chosen
    u = torch.rand(2, 5, 12, generator=g, dtype=torch.float64)
    pol = make_policy({"policy": "low_confidence"}, steps=5, gen_length=5, temperature=0.7,
                      confidence_eos_eot_inf=True)
    x0, conf = _block_tokens(span, pol, _Rows(u), mask_id=11, uniform_conf=False, eos_eot=(3, 4))
    noisy = span.double() - 0.7 * torch.log(-torch.log(u))   # the mask (11) competes too
    assert torch.equal(x0, noisy.argmax(-1))
    assert (x0 == 3).any()
    ref = span.clone()
    ref[..., 4] = float("-inf")                             # only EoT
    assert torch.equal(conf, F.softmax(ref, -1).gather(-1, x0[..., None]).squeeze(-1))
    assert (conf[x0 == 3] > 0).all()                        # EOS keeps its probability


def test_options_only_for_llada_block_policies(eos_heavy):
    with pytest.raises(ValueError, match="logits_eos_inf"):
        make_policy({"policy": "entropy"}, steps=4, gen_length=4, logits_eos_inf=True)
    from decoding_helpers import tiny_llama
    pol = make_policy({"policy": "low_confidence"}, steps=4, gen_length=4, logits_eos_inf=True)
    with pytest.raises(ValueError, match="eos_eot_tokens"):
        generate(tiny_llama(), [[1, 2, 3]], pol)


def test_off_is_the_plain_step():
    """Options off: the token step is generate.py's plain one (the other decoding tests pin
    the rest of the decoder unchanged)."""
    g = torch.Generator().manual_seed(1)
    span = torch.randn(2, 6, 12, generator=g).to(torch.bfloat16)
    pol = make_policy({"policy": "low_confidence"}, steps=6, gen_length=6)
    assert (pol.logits_eos_inf, pol.confidence_eos_eot_inf) == (False, False)
    x0, conf = _block_tokens(span, pol, None, mask_id=12, uniform_conf=False)  # no mask in vocab
    assert torch.equal(x0, span.argmax(-1))
    assert torch.equal(conf, torch.softmax(span, -1).gather(-1, x0[..., None]).squeeze(-1))
