"""DiffusionLM wiring: estimator choice by adapter, Dream's EOS, chat template, rolling,
and the lazy quantized-model hook."""
import dataclasses

import pytest
import torch
from lm_eval.api.instance import Instance

from fair_calib.evaluate.lm import (DiffusionLM, likelihood_settings, mc_loglikelihood,
                                    request_generator)
from tiny_eval_helpers import base_settings, make_loaded


def _ll(lm, ctx, cont):
    return lm.loglikelihood([Instance("loglikelihood", {}, (ctx, cont), 0)])[0]


def test_dream_family_appends_eos_and_uses_its_estimator():
    loaded = make_loaded("tiny-dream")
    # exact_below 0: the MC path (tiny-dream scores single-token targets exactly by default)
    lm = DiffusionLM(loaded, likelihood={"mc_num": 8, "batch_size": 4, "exact_below": 0}, seed=5)
    assert lm.lik.estimator == "dream"
    prefix, target = lm.encode_pair("Question : what is", " red")
    scored = target + [loaded.eos_id]
    ref = mc_loglikelihood(loaded, prefix, scored, lm.lik, request_generator(5, prefix, scored))[0]
    assert _ll(lm, "Question : what is", " red")[0] == ref


def test_dream_without_appended_eos_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """The authors' eval.py always appends EOS (its last position is never masked): without it
    a one-token choice would never be scored. Refused by name, before any loading."""
    loaded = make_loaded("tiny-dream")
    with pytest.raises(ValueError, match="append_eos=False"):
        DiffusionLM(loaded, likelihood={"mc_num": 8, "batch_size": 4, "append_eos": False})
    import fair_calib.models.adapters as adapters
    monkeypatch.setattr(adapters, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(ValueError, match="append_eos=False"):
        DiffusionLM(pretrained=str(tmp_path), family="tiny-dream", append_eos="False")
    # the LLaDA estimator appends nothing either way
    assert likelihood_settings({"estimator": "llada", "mc_num": 4, "batch_size": 4},
                               {"append_eos": False}).append_eos is False


def test_llada_family_scores_continuation_only(tiny_llada):
    lm = DiffusionLM(tiny_llada, likelihood={"mc_num": 8, "batch_size": 4}, seed=2)
    prefix, target = lm.encode_pair("Question : what is ", "red blue")   # space moves right
    assert tiny_llada.tokenizer.decode(target) == "red blue"
    ref = mc_loglikelihood(tiny_llada, prefix, target, lm.lik, request_generator(2, prefix, target))[0]
    ll, greedy = _ll(lm, "Question : what is ", "red blue")
    assert ll == ref and isinstance(greedy, bool)


def test_settings_validation():
    with pytest.raises(ValueError, match="unknown likelihood estimator"):
        likelihood_settings({"estimator": "ar", "mc_num": 4, "batch_size": 4})
    with pytest.raises(ValueError, match="cfg_scale is only defined"):
        likelihood_settings({"estimator": "dream", "mc_num": 4, "batch_size": 4}, {"cfg_scale": 0.5})
    # rows are the batch size, as in both authors' harnesses (Dream's max(mc_num // b, 1))
    st = likelihood_settings({"estimator": "llada", "mc_num": 8, "batch_size": 32})
    assert (st.rows, st.iterations) == (32, 1)
    st = likelihood_settings({"estimator": "llada", "mc_num": 128, "batch_size": 8})
    assert (st.rows, st.iterations) == (8, 16)


def test_rolling_covers_the_whole_text(tiny_llada):
    lm = DiffusionLM(tiny_llada, likelihood={"mc_num": 4, "batch_size": 4}, max_length=4)
    text = "what is the colour of the sky ?"
    (ll,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    ids = tiny_llada.tokenizer(text, add_special_tokens=False)["input_ids"]
    ref = sum(mc_loglikelihood(tiny_llada, [], ids[s:s + 4], lm.lik,
                               request_generator(0, "rolling", [], ids[s:s + 4]))[0]
              for s in range(0, len(ids), 4))
    assert ll == pytest.approx(ref) and ll < 0


def test_instruct_prompts_use_the_chat_template():
    loaded = make_loaded("tiny-llada")
    loaded.tokenizer.chat_template = ("{% for m in messages %}Question : {{ m['content'] }}"
                                      "{% endfor %}{% if add_generation_prompt %} Answer :{% endif %}")
    loaded = dataclasses.replace(loaded, adapter=dataclasses.replace(loaded.adapter, chat_template=True))
    lm = DiffusionLM(loaded, instruct=True)
    ids = lm._prompt_ids("what is 1 + 2 ?")
    assert loaded.tokenizer.decode(ids) == "Question : what is 1 + 2? Answer :"
    assert DiffusionLM(loaded, instruct=False)._prompt_ids("what") == \
        loaded.tokenizer("what", add_special_tokens=True)["input_ids"]


def test_calib_dir_loads_the_quantized_model_lazily(monkeypatch, tmp_path, synthetic_dir):
    """With a calib dir, evaluation runs on what fair_calib.methods.load_quantized returns."""
    import fair_calib.methods as methods
    from fair_calib.evaluate import run

    calls = []

    def fake_load_quantized(loaded, calib_dir):
        calls.append(str(calib_dir))
        with torch.no_grad():
            loaded.model.lm_head.weight.copy_(torch.round(loaded.model.lm_head.weight * 2) / 2)
        return loaded

    monkeypatch.setattr(methods, "load_quantized", fake_load_quantized)
    task = {"name": "synth_mc", "kind": "synthetic_mc", "mc_num": 4, "batch_size": 4}
    settings = base_settings(task, synthetic_dir)
    fp = run.evaluate(settings, None, None, tmp_path / "fp.parquet", loaded=make_loaded())
    q = run.evaluate(settings, None, tmp_path / "calib", tmp_path / "q.parquet", loaded=make_loaded())
    assert calls == [str(tmp_path / "calib")]
    fp_ll = DiffusionLM(make_loaded(), likelihood={"mc_num": 4, "batch_size": 4})
    q_ll = DiffusionLM(make_loaded(), calib_dir=str(tmp_path / "calib"),
                       likelihood={"mc_num": 4, "batch_size": 4})
    assert _ll(fp_ll, "what is", " red")[0] != _ll(q_ll, "what is", " red")[0]
    assert list(fp.columns) == list(q.columns)


def test_greedy_flag_and_arg_string(tiny_llada, tmp_path):
    lm = DiffusionLM(tiny_llada, likelihood={"mc_num": 4, "batch_size": 4}, compute_greedy=False)
    with_greedy = DiffusionLM(tiny_llada, likelihood={"mc_num": 4, "batch_size": 4})
    a, b = _ll(lm, "what is", " red"), _ll(with_greedy, "what is", " red")
    assert a[0] == b[0] and a[1] is False
    model_dir = tmp_path / "m"
    tiny_llada.model.save_pretrained(model_dir)
    tiny_llada.tokenizer.save_pretrained(model_dir)
    from_cli = DiffusionLM.create_from_arg_string(
        f"model_dir={model_dir},family=tiny-llada,mc_num=4,batch_size=4,gen_length=8,steps=8")
    assert from_cli.lik.mc_num == 4 and from_cli.policy().gen_length == 8
    assert _ll(from_cli, "what is", " red")[0] == pytest.approx(b[0], abs=1e-5)


def _gen_request(context, doc_id, task="synth"):
    return Instance("generate_until", {}, (context, {"until": []}), doc_id,
                    metadata=(task, doc_id, 1))


def test_a_prompt_is_never_cut_and_one_too_long_is_refused(tiny_llada, monkeypatch):
    """The authors' generation harnesses cut no prompt (OpenCompass runs LLaDA with
    ``max_seq_len`` None; eval_llada.py and Dream's eval.py pass it whole): the decoder gets
    the whole prompt, and one that does not fit the model's 128 positions beside the 8-token
    window is refused before anything is decoded, naming the task, document and lengths.
    Dream eval_instruct's own cap (``max_prompt_len``) still keeps a prompt's last tokens."""
    import fair_calib.decoding as decoding

    seen = []
    real = decoding.decode
    monkeypatch.setattr(decoding, "decode",
                        lambda model, prompts, *a, **k: seen.append(prompts) or real(model, prompts, *a, **k))
    lm = DiffusionLM(tiny_llada, decoding={"gen_length": 8, "steps": 8, "block_length": 8})
    assert lm.max_length == 128                        # the config's max_position_embeddings
    fits = " ".join(["sky"] * 120)                     # 120 + 8 = 128 tokens
    lm.generate_until([_gen_request(fits, 0)])
    assert [len(p) for p in seen[0]] == [120]
    seen.clear()
    with pytest.raises(ValueError, match=r"task 'synth', document 3: prompt of 121 tokens \+ "
                                         r"gen_length 8 = 129 tokens exceeds the model's limit "
                                         r"of 128"):
        lm.generate_until([_gen_request(fits, 0), _gen_request(fits + " sky", 3)])
    assert seen == []                                  # refused before any decoding
    capped = DiffusionLM(tiny_llada, decoding={"gen_length": 8, "steps": 8, "block_length": 8},
                         max_prompt_len=100)
    capped.generate_until([_gen_request("red " + " ".join(["sky"] * 130), 0)])
    assert seen[0] == [[tiny_llada.tokenizer.convert_tokens_to_ids("sky")] * 100]
