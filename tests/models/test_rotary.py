"""The fused rotary (fair_calib.models.rotary): transformers' arithmetic bit for bit, the
dispatcher's fallbacks, the setting."""
import os
import subprocess
import sys

import pytest
import torch

from fair_calib.models import rotary

KERNEL_SCRIPT = r"""
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.models.llama import modeling_llama as ml
from fair_calib.models import hub, rotary, rotary_triton as rt

rotary.install()
native = ml.apply_rotary_pos_emb.fair_calib_native
g = torch.Generator().manual_seed(0)
n = 0
# the interpreter rounds float32 -> bfloat16 toward zero (numpy has no bfloat16), so the
# kernel's arithmetic is checked here in float16 and float32 (the same code; bfloat16 on the
# GPU: the rotary stage and forwards of the since-retired benchmarks/lowbit_gpu.py, bit for
# bit, docs/benchmarks.md)
for qdt, cdt in ((torch.float16, torch.float16), (torch.float16, torch.float32),
                 (torch.float32, torch.float32)):
    for B, HQ, HK, S, D in ((2, 7, 3, 5, 16), (1, 4, 4, 3, 8), (3, 5, 1, 4, 32), (2, 3, 2, 1, 8)):
        for layout in ("bshd", "bhsd"):
            for cb in (B, 1):
                def heads(H):
                    t = torch.randn(B, S, H * D, generator=g).to(qdt).view(B, S, H, D)
                    t = t.transpose(1, 2)
                    return t if layout == "bshd" else t.contiguous()
                q, k = heads(HQ), heads(HK)
                cos, sin = (torch.randn(cb, S, D, generator=g).to(cdt) for _ in range(2))
                assert rotary.same_bits_possible(q, k, cos, sin)
                ref = native(q, k, cos, sin)
                out = rt.rotate(q, k, cos, sin, torch.result_type(q, cos))
                for r, o in zip(ref, out):
                    assert r.dtype == o.dtype and r.stride() == o.stride(), (r.stride(), o.stride())
                    assert torch.equal(r, o), (qdt, cdt, B, HQ, HK, S, D, layout, cb)
                n += 1

# whole models, the dispatcher taking the kernel on CPU: the attention's own layouts and call
rotary.fusable = rotary.same_bits_possible
calls = []
rotate = rt.rotate
rt.rotate = lambda *a: calls.append(1) or rotate(*a)
common = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=48, max_position_embeddings=64)
ids = torch.randint(0, 50, (2, 9), generator=g)
mask = torch.ones(2, 9, dtype=torch.long)
mask[1, :3] = 0
for cls, cfg, authors in ((LlamaForCausalLM, LlamaConfig(**common), False),
                          (LlamaForCausalLM, LlamaConfig(**common), True),
                          (Qwen2ForCausalLM, Qwen2Config(**common, num_key_value_heads=2), False)):
    torch.manual_seed(0)
    model = cls(cfg).eval()
    if authors:
        model = model.half()
        model.set_attn_implementation(hub.register_float32_rotary_attention())
        hub.use_authors_rotary(model, True, False)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        before = len(calls)
        fused = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        assert len(calls) - before == cfg.num_hidden_layers
        rotary.FORCE = False
        ref = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        rotary.FORCE = None
    assert torch.equal(fused, ref), (cls.__name__, authors)
    n += 1
print(n, "ok")
"""


def test_fused_rotary_equals_transformers_bit_for_bit_in_the_triton_interpreter():
    """The kernel against transformers' apply_rotary_pos_emb (float16 and float32 q, cos/sin
    in q's dtype or float32 as LLaDA's authors rotate, both q layouts, head counts that are
    not powers of two, GQA, cos shared over the batch or per row), outputs and their strides
    bit for bit; then whole Llama, Qwen2 and LLaDA-style float32-rotary models with a padded
    row give the same logits through the kernel as through transformers, run on CPU by
    Triton's interpreter."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", KERNEL_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-3000:]


def _qk(B=2, H=4, HK=2, S=5, D=8, dtype=torch.bfloat16, cdt=None):
    q = torch.randn(B, S, H * D).to(dtype).view(B, S, H, D).transpose(1, 2)
    k = torch.randn(B, S, HK * D).to(dtype).view(B, S, HK, D).transpose(1, 2)
    cos, sin = (torch.randn(B, S, D).to(cdt or dtype) for _ in range(2))
    return q, k, cos, sin


def test_the_kernel_is_taken_only_where_it_gives_the_same_bits():
    q, k, cos, sin = _qk()
    assert rotary.same_bits_possible(q, k, cos, sin)
    assert rotary.same_bits_possible(q.contiguous(), k, cos, sin)
    assert rotary.same_bits_possible(q, k, cos.float(), sin.float())
    assert rotary.same_bits_possible(q, k, cos[:1], sin[:1])
    assert not rotary.fusable(q, k, cos, sin)                           # CPU
    assert not rotary.same_bits_possible(q, k, cos, sin, unsqueeze_dim=2)
    assert not rotary.same_bits_possible(q[..., ::2], k[..., ::2], cos[..., ::2], sin[..., ::2])
    assert not rotary.same_bits_possible(q[:, :2], k, cos, sin)         # not dense
    assert not rotary.same_bits_possible(q, k.float(), cos, sin)
    assert not rotary.same_bits_possible(q, k, cos.half(), sin.half())
    assert not rotary.same_bits_possible(q, k, cos, sin.float())
    assert not rotary.same_bits_possible(*_qk(D=7)[:2], *_qk(D=7)[2:])  # odd head dim
    qg = q.detach().requires_grad_(True)
    assert not rotary.same_bits_possible(qg, k, cos, sin)               # autograd: transformers'
    with torch.no_grad():
        assert rotary.same_bits_possible(qg, k, cos, sin)


def test_install_routes_transformers_through_the_dispatcher_once():
    from transformers.models.llama import modeling_llama as ml
    from transformers.models.qwen2 import modeling_qwen2 as mq

    rotary.install()
    assert rotary.install() == []
    for mod in (ml, mq):
        native = mod.apply_rotary_pos_emb.fair_calib_native
        assert not hasattr(native, "fair_calib_native")
        q, k, cos, sin = _qk()
        for got, want in zip(mod.apply_rotary_pos_emb(q, k, cos, sin), native(q, k, cos, sin)):
            assert torch.equal(got, want)                               # CPU: transformers'


def test_the_setting_is_read_and_checked(monkeypatch):
    monkeypatch.setattr(rotary, "FORCE", None)
    monkeypatch.delenv(rotary.SETTING, raising=False)
    assert rotary.enabled()
    monkeypatch.setenv(rotary.SETTING, "native")
    assert not rotary.enabled()
    monkeypatch.setenv(rotary.SETTING, "fast")
    with pytest.raises(ValueError, match=r"FAIR_CALIB_ROTARY='fast': expected one of fused, native"):
        rotary.enabled()
