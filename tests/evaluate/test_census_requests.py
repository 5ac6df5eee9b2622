"""The census counts what an evaluate run sends: the same likelihood items and generation
prompts (token ids) reach the model, and the same forwards (rows x tokens) run, on tiny
random models over the synthetic tasks and a few documents of offline ones."""
from collections import Counter

import pytest

import fair_calib.decoding
import fair_calib.evaluate.lm as lm_module
from fair_calib.budget import census
from fair_calib.evaluate.run import evaluate
from tiny_eval_helpers import base_settings, make_loaded


def _recorded_run(settings, loaded, tmp_path):
    """An evaluate run that records the (prefix, scored target) items scored, the prompts
    decoded and every forward's (rows, tokens)."""
    seen = {"items": [], "prompts": [], "forwards": Counter()}
    score, decode, logits = lm_module.score_requests, fair_calib.decoding.decode, loaded.logits

    def scored(loaded_, items, st, seed):
        seen["items"] += [(list(p), list(t)) for p, t in items]
        return score(loaded_, items, st, seed)

    def decoded(loaded_, prompts, *args, **kwargs):
        seen["prompts"] += [list(p) for p in prompts]
        return decode(loaded_, prompts, *args, **kwargs)

    def counted(ids, *args, **kwargs):
        seen["forwards"][tuple(ids.shape)] += 1
        return logits(ids, *args, **kwargs)

    loaded.logits = counted
    mp = pytest.MonkeyPatch()
    mp.setattr(lm_module, "score_requests", scored)
    mp.setattr(fair_calib.decoding, "decode", decoded)
    try:
        evaluate(settings, None, None, tmp_path / "out.parquet", loaded=loaded)
    finally:
        mp.undo()
    return seen


def _census_side(settings, loaded):
    context = int(loaded.model.config.max_position_embeddings)    # the tiny model's: 128
    lm = census.recording_lm(census.encoding_args(settings, loaded.tokenizer, context))
    requests = census.evaluation_requests(settings, lm)
    items = [(p, s) for p, s, _ in lm.likelihood_items(
        [(a[0], a[1]) for a in requests.get("loglikelihood", [])])]
    policy = lm.policy()
    prompts = [lm.generation_prompt(a[0], policy.gen_length)
               for a in requests.get("generate_until", [])]
    return items, prompts, census.evaluation_forwards(requests, lm)


def _shapes(forwards: Counter) -> Counter:
    return Counter({(rows, tokens): n for (_, rows, tokens), n in forwards.items()})


CHAT = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} .{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")


def _tiny(family, chat, context=None):
    loaded = make_loaded(family)
    if chat:
        loaded.tokenizer.chat_template = CHAT
    if context:     # room for few-shot prompts (a prompt that does not fit is refused, uncut)
        loaded.model.config.max_position_embeddings = context
    return loaded


def _check(settings, family, tmp_path, chat=False, context=None):
    loaded = _tiny(family, chat, context)
    run = _recorded_run(settings, loaded, tmp_path)
    items, prompts, forwards = _census_side(settings, _tiny(family, chat, context))
    assert items == run["items"]                 # the same requests, the same ids
    assert sorted(prompts) == sorted(run["prompts"])
    assert _shapes(forwards) == run["forwards"]  # the same forwards, rows x tokens
    assert sum(run["forwards"].values()) > 0
    return forwards


@pytest.mark.parametrize("family", ["tiny-llada", "tiny-dream"])
def test_synthetic_mc_and_gen(family, synthetic_dir, tmp_path):
    mc = base_settings({"name": "synth_mc", "kind": "synthetic_mc", "limit": 5,
                        "exact_below": 2}, synthetic_dir)
    mc["model"]["family"] = family
    fwd = _check(mc, family, tmp_path / "mc")
    assert {cls for cls, _, _ in fwd} == {"exact"}           # one-token colours: exact mode
    gen = base_settings({"name": "synth_gen", "kind": "synthetic_gen", "limit": 3,
                         "batch_size": 2, "early_exit": False}, synthetic_dir)
    gen["model"]["family"] = family
    fwd = _check(gen, family, tmp_path / "gen")
    assert sum(n for (cls, rows, _), n in fwd.items() if cls == "generate") == 2 * 16


def test_chat_turns_rendered_by_lm_eval(synthetic_dir, tmp_path):
    """A recipe's chat options (apply_chat_template, few-shot turns): lm-eval renders the turns
    with the model's template in both."""
    gen = base_settings({"name": "synth_gen", "kind": "synthetic_gen", "limit": 2,
                         "num_fewshot": 1, "apply_chat_template": True,
                         "fewshot_as_multiturn": True, "early_exit": False}, synthetic_dir)
    _check(gen, "tiny-llada", tmp_path, chat=True)
    tok = _tiny("tiny-llada", True).tokenizer
    contexts = [a[0] for a in census.evaluation_requests(gen, census.recording_lm(
        census.encoding_args(gen, tok, 128)))["generate_until"]]
    # one exemplar turn pair, then the question's turn, then the answer opens
    assert len(contexts) == 2 and all(c.count("<user>") == 2 and c.endswith("<assistant>")
                                      for c in contexts)


def test_offline_tasks_with_guidance_and_few_shots(offline_data_dir, tmp_path):
    """PIQA's sampled choices with cfg (two passes a forward), GSM8K-CoT's 2-shot prompts."""
    piqa = base_settings({"name": "piqa", "kind": "lm_eval", "lm_eval_task": "piqa",
                          "limit": 3, "num_fewshot": 0, "cfg_scale": 0.5, "mc_num": 4,
                          "batch_size": 2}, data=offline_data_dir)
    fwd = _check(piqa, "tiny-llada", tmp_path / "piqa")
    assert set(fwd) and all(cls == "mc" and rows == 4 for cls, rows, _ in fwd)
    gsm = base_settings({"name": "gsm8k_cot", "kind": "lm_eval", "lm_eval_task": "gsm8k_cot",
                         "limit": 2, "num_fewshot": 2, "early_exit": False, "batch_size": 1},
                        data=offline_data_dir)
    fwd = _check(gsm, "tiny-dream", tmp_path / "gsm", context=1024)
    assert sum(fwd.values()) == 2 * 16
