"""Decoding equals the authors' decoders, written here from their code's arithmetic.

``ref_llada_generate`` follows ML-GSAI/LLaDA ``generate.py`` (temperature 0, low_confidence:
softmax in the logits' dtype, confidence of the argmax token, ``torch.topk`` per row over the
whole sequence with ``-inf`` after the current block and at unmasked positions; an argmax that
is the mask token committed as it is). ``ref_dream_sample``
follows Dream's ``generation_utils._sample`` as ``eval/eval.py`` calls it (temperature 0,
top-p then top-k filtering with ``finfo.min``, ``entropy`` / ``maskgit_plus`` / ``topk_margin``
confidences in the logits' dtype, one batch-mean commit count ``int(mean * (1 - s/t))``,
``torch.topk`` over the batch's full rows). Run in bfloat16 and with top-p, where ties between
confidences are common and the tie-breaking of ``torch.topk`` decides which positions commit,
and with heads that make the mask token the argmax at some positions.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fixtures.hub_checkpoints import dream_checkpoint, llada_checkpoint
from fair_calib.decoding import generate, make_policy
from fair_calib.models.adapters import load_model


def ref_llada_generate(model, prompt, steps, gen_length, block_length, mask_id):
    """Returns the window after every step (the commit order, not only the result)."""
    history = []
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, :prompt.shape[1]] = prompt
    num_blocks = gen_length // block_length
    steps = steps // num_blocks
    for b in range(num_blocks):
        lo = prompt.shape[1] + b * block_length
        block_mask = x[:, lo:lo + block_length] == mask_id
        n = block_mask.sum(1, keepdim=True)
        counts = torch.zeros(x.shape[0], steps, dtype=torch.int64) + n // steps
        for i in range(x.shape[0]):
            counts[i, :int(n[i] % steps)] += 1
        for i in range(steps):
            mask_index = x == mask_id
            logits = model(x).logits
            x0 = torch.argmax(logits, dim=-1)
            p = F.softmax(logits, dim=-1)
            x0_p = torch.gather(p, -1, x0[..., None]).squeeze(-1)
            x0_p[:, lo + block_length:] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -np.inf)
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(confidence.shape[0]):
                _, idx = torch.topk(confidence[j], k=int(counts[j, i]))
                transfer[j, idx] = True
            x[transfer] = x0[transfer]
            history.append(x[:, prompt.shape[1]:].clone())
    return history


def ref_dream_sample(model, ids, max_new, steps, mask_id, alg="entropy", top_p=None,
                     top_k=None, eps=1e-3):
    """Returns the window after every step (the commit order, not only the result)."""
    x = F.pad(ids, (0, max_new), value=mask_id)
    history = []
    timesteps = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        mask_index = x == mask_id
        logits = model(x).logits
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        mask_logits = logits[mask_index]
        t, s = timesteps[i], timesteps[i + 1]
        if top_p is not None and top_p < 1:
            sl, si = torch.sort(mask_logits, descending=True)
            remove = torch.cumsum(F.softmax(sl, dim=-1), dim=-1) > top_p
            remove[..., 1:] = remove[..., :-1].clone()
            remove[..., 0] = 0
            remove = torch.zeros_like(mask_logits, dtype=torch.bool).scatter_(-1, si, remove)
            mask_logits = mask_logits.masked_fill(remove, torch.finfo(mask_logits.dtype).min)
        if top_k is not None:
            kth = torch.topk(mask_logits, top_k)[0][..., -1, None]
            mask_logits = mask_logits.masked_fill(mask_logits < kth,
                                                  torch.finfo(mask_logits.dtype).min)
        probs = torch.softmax(mask_logits, dim=-1)
        confidence, x0 = probs.max(dim=-1)
        if alg == "topk_margin":
            top = torch.sort(probs, dim=-1, descending=True)[0]
            confidence = top[:, 0] - top[:, 1]
        elif alg == "entropy":
            confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
        num = mask_index.sum() / mask_index.shape[0]
        n = int(num * (1 - s / t)) if i < steps - 1 else int(num)
        full = torch.full_like(x, -torch.inf, dtype=logits.dtype)
        full[mask_index] = confidence
        if n > 0:
            _, transfer = torch.topk(full, n)
            x_ = torch.zeros_like(x) + mask_id
            x_[mask_index] = x0.clone()
            rows = torch.arange(x.size(0)).unsqueeze(1).expand_as(transfer)
            x[rows, transfer] = x_[rows, transfer]
        history.append(x[:, ids.shape[1]:].clone())
    return history


def _never_predicts_the_mask(lm, sharpen: float = 1.0):
    """As a trained model: the mask token gets ~0 probability (a random toy head would
    sometimes predict it; the tests below with ``_predicts_the_mask`` cover that case).
    ``sharpen`` scales the head: confident predictions, one-token nuclei, tied confidences."""
    head = lm.model.lm_head
    with torch.no_grad():
        head.weight.mul_(sharpen)
        head.bias = torch.nn.Parameter(torch.zeros(head.out_features, dtype=head.weight.dtype))
        head.bias[lm.mask_id] = -30.0
    return lm


class Steps:
    """Records the window after every decoding step."""
    def start(self, b, k, T):
        self.windows = []

    def step(self, t, logits, masked, committed, window):
        self.windows.append(window.clone())

    def finish(self, out):
        pass


def _decode_history(lm, prompts, pol):
    rec = Steps()
    generate(lm, prompts.tolist(), pol, recorder=rec)
    return [w.tolist() for w in rec.windows]


def _prompts(n_rows, length, seed):
    return torch.randint(0, 90, (n_rows, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_llada_low_confidence_equals_generate_py(dtype, tmp_path):
    llada_checkpoint(tmp_path / "m")
    lm = _never_predicts_the_mask(load_model(tmp_path / "m", "llada", dtype=dtype))
    pol = make_policy(lm, policy="low_confidence", steps=8, gen_length=16, block_length=8)
    for seed in range(3):
        prompt = _prompts(1, 6, seed)
        with torch.no_grad():
            want = ref_llada_generate(lm.model, prompt, 8, 16, 8, lm.mask_id)
        assert _decode_history(lm, prompt, pol) == [w.tolist() for w in want], seed


@pytest.mark.parametrize("dtype,alg,top_p,top_k,sharpen", [
    ("float32", "entropy", None, None, 1), ("bfloat16", "entropy", None, None, 1),
    ("float32", "entropy", 0.95, None, 1), ("bfloat16", "entropy", 0.9, 20, 1),
    ("bfloat16", "maskgit_plus", None, None, 1), ("float32", "topk_margin", 0.95, None, 1),
    # confident predictions and a nucleus of one token: entropy exactly 0 (probability
    # exactly 1) at many positions, so torch.topk's tie order decides what commits
    ("float32", "entropy", 0.95, None, 20), ("bfloat16", "maskgit_plus", 0.95, None, 20)])
def test_dream_schedule_equals_eval_py_sampling(dtype, alg, top_p, top_k, sharpen, tmp_path):
    dream_checkpoint(tmp_path / "m")
    lm = _never_predicts_the_mask(load_model(tmp_path / "m", "dream", dtype=dtype), sharpen)
    pol = make_policy(lm, policy=alg, steps=12, gen_length=12, top_p=top_p, top_k=top_k)
    for seed in range(3):
        prompts = _prompts(2, 7, seed)                # two rows: one count for the batch
        with torch.no_grad():
            want = ref_dream_sample(lm.model, prompts, 12, 12, lm.mask_id, alg, top_p, top_k)
        assert _decode_history(lm, prompts, pol) == [w.tolist() for w in want], seed


def test_dream_defaults_are_what_eval_py_runs():
    """eval.py passes top_p=None and top_k=None (its defaults) to diffusion_generate; leaving
    top_k out instead would inherit transformers' top_k=50 (docs/fidelity.md)."""
    from fair_calib.models.adapters import get_adapter
    pol = make_policy(get_adapter("dream"))
    assert (pol.name, pol.temperature, pol.top_p, pol.top_k, pol.alg_temp, pol.eps) == \
        ("entropy", 0.0, None, None, 0.0, 1e-3)


def _predicts_the_mask(lm, bias: float):
    """A head that favours the mask token by ``bias``: at 2-3 it is the argmax of many, but not
    all, positions, so the authors' decoders commit it there and decode on around it."""
    head = lm.model.lm_head
    with torch.no_grad():
        head.bias = torch.nn.Parameter(torch.zeros(head.out_features, dtype=head.weight.dtype))
        head.bias[lm.mask_id] = bias
    return lm


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_llada_commits_an_argmax_that_is_the_mask_as_generate_py(dtype, tmp_path):
    """generate.py keeps the argmax when it is the mask token: the position stays masked and,
    in later blocks too, competes again for each step's count. Four blocks, every step's
    window equal to the transcription's; the seeds cover outputs that end with masks left."""
    llada_checkpoint(tmp_path / "m")
    lm = _predicts_the_mask(load_model(tmp_path / "m", "llada", dtype=dtype), 3.0)
    pol = make_policy(lm, policy="low_confidence", steps=8, gen_length=16, block_length=4)
    ends_masked = 0
    for seed in range(4):
        prompt = _prompts(1, 6, seed)
        with torch.no_grad():
            want = [w.tolist() for w in ref_llada_generate(lm.model, prompt, 8, 16, 4, lm.mask_id)]
        assert _decode_history(lm, prompt, pol) == want, seed
        ends_masked += (torch.tensor(want[-1]) == lm.mask_id).any().item()
    assert ends_masked >= 1          # the rule is exercised: masks left in earlier blocks


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("alg", ["entropy", "maskgit_plus", "topk_margin"])
def test_dream_commits_an_argmax_that_is_the_mask_as_eval_py(dtype, alg, tmp_path):
    """Dream's ``sample_tokens`` keeps the argmax when it is the mask token, and ``_sample``'s
    next count reads the masked positions (``mask_index.sum()``), the re-masked ones included.
    One row, as the authors' ``--batch_size 1`` (with rows whose masked counts differ, their
    batch-wide topk picks positions at -inf and writes the mask there; see docs/fidelity.md)."""
    dream_checkpoint(tmp_path / "m")
    lm = _predicts_the_mask(load_model(tmp_path / "m", "dream", dtype=dtype), 2.0)
    pol = make_policy(lm, policy=alg, steps=12, gen_length=12)
    some_left = 0
    for seed in range(4):
        prompts = _prompts(1, 7, seed)
        with torch.no_grad():
            want = [w.tolist() for w in ref_dream_sample(lm.model, prompts, 12, 12, lm.mask_id, alg)]
        assert _decode_history(lm, prompts, pol) == want, seed
        some_left += 0 < int((torch.tensor(want[-1]) == lm.mask_id).sum()) < 12
    assert some_left >= 1            # partly masked outputs: counts read, not scheduled


def test_an_argmax_that_is_the_mask_is_committed(tmp_path):
    """The mask every position's argmax: each step commits its count of mask tokens and the
    window ends as it began (generate.py, sample_tokens); ``random_commit``, the project's
    Stage I policy, commits the best other token instead."""
    llada_checkpoint(tmp_path / "m")
    lm = _predicts_the_mask(load_model(tmp_path / "m", "llada"), 1e4)
    prompts = _prompts(2, 5, 0).tolist()
    for policy in ("low_confidence", "entropy", "maskgit_plus"):
        pol = make_policy(lm, policy=policy, steps=8, gen_length=8,
                          block_length=8 if policy == "low_confidence" else None)
        rec = Steps()
        out = generate(lm, prompts, pol, recorder=rec)
        assert bool((out == lm.mask_id).all()), policy
        assert all(bool((w == lm.mask_id).all()) for w in rec.windows), policy
    pol = make_policy(lm, policy="random_commit", steps=8, gen_length=8)
    out = generate(lm, prompts, pol, generator=torch.Generator().manual_seed(0))
    assert not bool((out == lm.mask_id).any())
