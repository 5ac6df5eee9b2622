"""Embedded tiny diffusion LMs: synthetic corpus, tokenizer, a very short training run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fair_calib.models.tiny import corpus as tc
from fair_calib.models.tiny.tokenizer import SPECIAL_TOKENS, build_tokenizer

SMALL = {"n_train_docs": 1500, "n_calib": 24, "n_probe": 16, "n_facts": 16, "n_mc": 30,
         "n_gen": 20}
FILES = ("train.txt", "calib.jsonl", "probe.jsonl", "facts.jsonl", "synth_mc.jsonl",
         "synth_gen.jsonl", "manifest.json")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tinydata")
    tc.run_cli(["--settings", json.dumps({"seed": 0, "corpus": SMALL}), "--out", str(out)])
    return out


def test_corpus_is_deterministic(data_dir, tmp_path):
    tc.make_data({"seed": 0, "corpus": SMALL}, tmp_path / "again")
    for name in FILES:
        assert (data_dir / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name
    tc.make_data({"seed": 1, "corpus": SMALL}, tmp_path / "other")
    assert (data_dir / "train.txt").read_bytes() != (tmp_path / "other" / "train.txt").read_bytes()


def test_corpus_counts_and_formats(data_dir):
    manifest = json.loads((data_dir / "manifest.json").read_text())
    assert manifest["counts"]["synth_mc"] == SMALL["n_mc"]
    assert manifest["counts"]["synth_gen"] == SMALL["n_gen"]
    mc = _jsonl(data_dir / "synth_mc.jsonl")
    assert len(mc) == SMALL["n_mc"]
    for it in mc:
        assert it["query"].startswith("Question: ") and it["query"].endswith("\nAnswer:")
        assert 0 <= it["gold"] < len(it["choices"])
        assert all(c.startswith(" ") for c in it["choices"])
        assert len(set(it["choices"])) == len(it["choices"])
    chance = sum(1 / len(it["choices"]) for it in mc) / len(mc)
    assert manifest["chance"]["synth_mc"] == pytest.approx(chance)
    for it in _jsonl(data_dir / "synth_gen.jsonl"):
        work, final = it["answer"].rsplit("\n#### ", 1)
        assert work == f"it is {final} ." and final in tc.COLOURS
    for it in _jsonl(data_dir / "probe.jsonl"):
        work, final = it["answer"].rsplit("\n#### ", 1)
        lhs, rhs = work.rstrip(" .").split(" = ")
        a, op, b = lhs.split()
        assert int(rhs) == int(final) == (int(a) + int(b) if op == "+" else int(a) - int(b))
        assert 0 <= int(final) <= manifest["corpus"]["max_number"]


def test_held_out_items_are_not_in_training(data_dir):
    train = (data_dir / "train.txt").read_text().splitlines()
    train_set = set(train)
    train_text = "\n".join(train)
    for name in ("calib.jsonl", "facts.jsonl"):
        for row in _jsonl(data_dir / name):
            assert row["text"] not in train_set
    for name in ("synth_gen.jsonl", "probe.jsonl"):
        for it in _jsonl(data_dir / name):
            # neither the question nor the whole document occurs in any training document
            assert f"Question: {tc.one_line(it['question'])} Answer:" not in train_text
    for it in _jsonl(data_dir / "synth_mc.jsonl"):
        for choice in it["choices"]:
            assert tc.one_line(it["query"] + choice) not in train_set
        assert tc.one_line(it["query"]) not in train_text
    # the facts the MC items need are stated in training
    manifest = json.loads((data_dir / "manifest.json").read_text())
    for obj, colour in list(manifest["world"]["colour_of"].items())[:5]:
        assert f"{obj} is {colour} ." in train_text


def test_tokenizer_round_trip(data_dir, tmp_path):
    from transformers import AutoTokenizer

    build_tokenizer(data_dir / "train.txt").save_pretrained(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert tok.pad_token == "[PAD]" and tok.eos_token == "[EOS]" and tok.mask_token == "[MASK]"
    for i in range(100):  # every number is one known token
        ids = tok(f" {i}", add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and ids[0] != tok.unk_token_id
    assert tok.decode(tok(" 7", add_special_tokens=False)["input_ids"]) == "7"
    ids = tok("3 + 4 = 7 .\n#### 7")["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "3 + 4 = 7. #### 7"
    assert tok.convert_ids_to_tokens(ids[-2:]) == ["####", "7"]
    # a newline is whitespace: the task format and its one-line training form tokenize alike
    q = "Question: Tom has 3 pens .\nAnswer:"
    assert tok(q)["input_ids"] == tok(tc.one_line(q))["input_ids"]
    assert tok.unk_token_id not in tok(q)["input_ids"]
    text = "Question: Tom has 3 pens and gets 4 more . Answer: 3 + 4 = 7 . #### 7"
    assert tok(tok.decode(tok(text)["input_ids"], skip_special_tokens=True))["input_ids"] == tok(text)["input_ids"]


TINY = {"hidden": 32, "layers": 1, "heads": 2, "intermediate": 64, "steps": 4,
        "batch_size": 4, "lr": 1e-3, "seq_len": 48, "threads": 1}


@pytest.mark.parametrize("family", ["tiny-llada", "tiny-dream"])
def test_short_training_run_loads_through_adapter(family, data_dir, tmp_path):
    import pandas as pd
    from fair_calib.models.adapters import load_model
    from fair_calib.models.tiny import train as tt

    out = tmp_path / family
    settings = {"seed": 0, "device": "cpu", "dtype": "float32",
                "model": {"name": family, "family": family, "train": TINY}}
    import os

    umask = os.umask(0o022)
    try:
        tt.run_cli(["--settings", json.dumps(settings), "--data", str(data_dir), "--out", str(out),
                    "--no-progress"])
    finally:
        os.umask(umask)
    assert sorted(p.name for p in tmp_path.iterdir()) == [family]  # no temp folder left
    # every file as the umask says (save_pretrained writes model.safetensors 0600 itself)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()}
    assert set(modes.values()) == {"0o644"}, modes
    for name in ("config.json", "model.safetensors", "tokenizer.json", "fair_calib.json",
                 "train_log.parquet"):
        assert (out / name).exists(), name
    meta = json.loads((out / "fair_calib.json").read_text())
    assert meta["family"] == family and meta["provenance"]["seed"] == 0
    log = pd.read_parquet(out / "train_log.parquet")
    assert list(log["step"]) == list(range(TINY["steps"]))
    assert log["loss"].notna().all()

    lm = load_model(out, family)
    assert lm.mask_id == lm.tokenizer.convert_tokens_to_ids("[MASK]") == 1
    # the adapter gets the word-level tokenizer as trained (not a model-type default class)
    ref = build_tokenizer(data_dir / "train.txt")
    text = "Question: Tom has 3 pens and gets 4 more . How many pens does Tom have now ?\nAnswer:"
    assert lm.tokenizer(text)["input_ids"] == ref(text)["input_ids"]
    assert lm.tokenizer.unk_token_id not in lm.tokenizer(text)["input_ids"]
    assert lm.pad_id == 0 and lm.eos_id == 2
    assert len(lm.blocks) == TINY["layers"]
    ids = torch.tensor([lm.tokenizer("Question: Tom has 3 pens .\nAnswer:")["input_ids"] + [lm.mask_id] * 5])
    with torch.no_grad():
        logits = lm.logits(ids)
        raw = lm.model(input_ids=ids).logits
        # bidirectional: the last token changes the logits at the first position
        other = ids.clone()
        other[0, -1] = lm.eos_id
        raw_other = lm.model(input_ids=other).logits
    assert logits.shape == (1, ids.shape[1], len(lm.tokenizer))
    assert not torch.allclose(raw[0, 0], raw_other[0, 0])
    attn = lm.blocks[0].self_attn
    if family == "tiny-dream":
        assert type(lm.model).__name__ == "Qwen2ForCausalLM" and lm.adapter.logit_shift
        assert all(getattr(attn, p).bias is not None for p in ("q_proj", "k_proj", "v_proj"))
        assert attn.o_proj.bias is None
        torch.testing.assert_close(logits[:, 1:], raw[:, :-1])
        torch.testing.assert_close(tt.aligned_logits(raw, True), logits)
    else:
        assert type(lm.model).__name__ == "LlamaForCausalLM" and not lm.adapter.logit_shift
        assert all(getattr(attn, p).bias is None for p in ("q_proj", "k_proj", "v_proj"))
        torch.testing.assert_close(logits, raw)
    assert lm.model.lm_head.weight.data_ptr() != lm.embed.weight.data_ptr()  # untied head
    assert not lm.model.config.tie_word_embeddings


def test_training_is_deterministic_and_learns(data_dir, tmp_path):
    from fair_calib.models.tiny import train as tt
    from safetensors.torch import load_file

    train = {**TINY, "steps": 25, "lr": 1e-2, "batch_size": 8}
    settings = {"seed": 0, "model": {"name": "tiny-llada", "family": "tiny-llada", "train": train}}
    a = tt.train_tiny(settings, data_dir, tmp_path / "a", progress=False)
    b = tt.train_tiny(settings, data_dir, tmp_path / "b", progress=False)
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a["final_loss"] == b["final_loss"]
    import pandas as pd
    log = pd.read_parquet(tmp_path / "a" / "train_log.parquet")
    assert log["loss"].iloc[-10:].mean() < 0.7 * log["loss"].iloc[:5].mean()


def test_batches_and_loss_respect_masking_rules():
    from fair_calib.models.tiny import train as tt

    ids = {"[PAD]": 0, "[MASK]": 1, "[EOS]": 2, "[BOS]": 3}
    docs = [[3, 10, 11, 12, 13], [3, 20, 21]]
    cfg = {**tt.DEFAULT_TRAIN, "sft_frac": 1.0, "no_bos_frac": 0.0, "no_eos_frac": 0.0}
    batcher = tt.Batcher(docs, [3, -1], seq_len=12, ids=ids, train=cfg, seed=0)
    for _ in range(20):
        x, attn, maskable = batcher.batch(2)
        assert not maskable[:, 0].any()                   # BOS is never masked
        assert not (maskable & (attn == 0)).any()         # padding is never in the loss
        assert ((x == 2) & (attn == 1)).any(1).all()      # every row has an [EOS] tail
        for r in range(2):
            if x[r, 1] == 10:                             # SFT row: only the answer is masked
                assert not maskable[r, :3].any() and maskable[r, 3]
    assert tt.lr_at(0, 100, 1.0, 0.1, 0.1) == pytest.approx(0.1)
    assert tt.lr_at(99, 100, 1.0, 0.1, 0.1) == pytest.approx(0.1, abs=1e-3)


def test_corpus_setting_aliases_and_typos():
    a = tc.build_corpus({"seed": 0, "corpus": {**SMALL, "n_train_docs": 300}})
    alias = {"n_train_docs": 300, "n_calib_docs": SMALL["n_calib"], "n_probe": SMALL["n_probe"],
             "n_facts": SMALL["n_facts"], "n_mc_items": SMALL["n_mc"], "n_gen_items": SMALL["n_gen"]}
    b = tc.build_corpus({"seed": 0, "corpus": alias})
    assert a["synth_mc"] == b["synth_mc"] and a["calib"] == b["calib"] and a["train"] == b["train"]
    with pytest.raises(KeyError, match="n_trian_docs"):
        tc.build_corpus({"seed": 0, "corpus": {"n_trian_docs": 10}})
