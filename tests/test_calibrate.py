"""Stage II driver: weighted loss, resume, NaN detection, outputs."""
import json

import pytest
import torch

from fair_calib.jobs import io
from fair_calib.calibrate import NonFiniteError, calibrate, weighted_mse
from fair_calib.methods import load_quantized, make_method
from fair_calib.quant.blockio import call_block, capture_block_inputs
from fair_calib.quant.discovery import discover_groups
from fair_calib.quant.toy import tiny_random_loaded

torch.set_num_threads(1)
IDS = torch.randint(0, 60, (8, 16), generator=torch.Generator().manual_seed(0))
QUIET = dict(log=lambda s: None)


def _fq(**cfg):
    return make_method({"type": "flatquant", "epochs": 3, "lr": 5e-3, **cfg}, 4, 4, seed=0)


def test_calibration_lowers_weighted_loss_and_writes_outputs(tmp_path):
    lm = tiny_random_loaded("llama", layers=2)
    w = torch.linspace(0.1, 2.0, IDS.shape[1])
    # propagate: fp: with the teacher default, block 1's loss also holds the error inherited
    # from block 0, which block 1 cannot remove (teacher propagation has its own test below)
    meta = calibrate(lm, make_method({"type": "fair_calib", "epochs": 8, "lr": 1e-2,
                                      "propagate": "fp"}, 4, 4), IDS, tmp_path,
                     weights=w, batch_size=4, run_info={"method_name": "fair-calib"}, **QUIET)
    df, prov = io.read_parquet(tmp_path / "stats.parquet")
    assert list(df.columns) == ["block", "epoch", "loss", "seconds", "peak_mem_mb", "peak_mem_kind"]
    for b in (0, 1):
        rows = df[df.block == b].sort_values("epoch")
        assert rows.epoch.tolist() == list(range(-1, 8))
        assert rows.loss.iloc[-1] < 0.93 * rows.loss.iloc[0]
    assert (df.peak_mem_mb >= 0).all() and set(df.peak_mem_kind) == {meta["peak_mem_kind"]}
    assert meta["peak_mem_kind"] in ("cpu_rss_added", "cpu_process_peak_rss")
    on_disk = json.loads((tmp_path / "meta.json").read_text())
    assert on_disk["method"] == "fair-calib" and on_disk["type"] == "fair_calib"
    assert on_disk["weighting"] == "prior" and len(on_disk["position_weights"]) == 16
    assert abs(sum(on_disk["position_weights"]) / 16 - 1) < 1e-6
    params, _ = io.load_tensors(tmp_path / "params.safetensors")
    assert any(k.startswith("1.g0.transform.f1.") for k in params)
    assert sorted(p.name for p in (tmp_path / "blocks").iterdir()) == ["0.safetensors", "1.safetensors"]
    assert meta["groups"]["0"][0]["names"] == ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]


def test_zero_weight_position_has_no_influence_on_gradient():
    lm = tiny_random_loaded("llama", layers=1)
    inputs = capture_block_inputs(lm.model, lm.blocks[0], IDS[:2], 2)
    block = lm.blocks[0]
    groups = discover_groups(block, lambda: call_block(block, inputs, 0))
    method = _fq()
    with torch.no_grad():
        target = call_block(block, inputs, 0)
    from fair_calib.calibrate import _targets_and_stats
    _, stats = _targets_and_stats(block, inputs, groups, False, 0)
    method.quantize_block(block, groups, stats, 0)
    params = method.parameters(block)
    w = torch.ones(IDS.shape[1])
    w[5] = 0.0

    def grads(tgt):
        for p in params:
            p.grad = None
        weighted_mse(call_block(block, inputs, 0), tgt, w).backward()
        return [p.grad.clone() for p in params]

    g0 = grads(target)
    moved = target.clone()
    moved[:, 5] += 10.0                      # change only the zero-weight position's target
    g1 = grads(moved)
    assert all(torch.allclose(a, b, atol=1e-7, rtol=0) for a, b in zip(g0, g1))
    moved2 = target.clone()
    moved2[:, 6] += 10.0                     # a weighted position does matter
    g2 = grads(moved2)
    assert not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g0, g2))


class _Interrupt(Exception):
    pass


@pytest.mark.parametrize("propagate", ["quant", "teacher"])
def test_resume_after_interruption_gives_same_params(tmp_path, propagate):
    def run(out, hook=None):
        lm = tiny_random_loaded("llama", layers=3)
        return calibrate(lm, _fq(epochs=2, propagate=propagate), IDS, out, batch_size=4,
                         on_block_done=hook, **QUIET)

    run(tmp_path / "a")

    def boom(i):
        if i == 1:
            raise _Interrupt

    with pytest.raises(_Interrupt):
        run(tmp_path / "b", boom)
    assert not (tmp_path / "b" / "meta.json").exists()
    assert sorted(p.name for p in (tmp_path / "b" / "blocks").iterdir()) == ["0.safetensors", "1.safetensors"]
    run(tmp_path / "b")
    pa, _ = io.load_tensors(tmp_path / "a" / "params.safetensors")
    pb, _ = io.load_tensors(tmp_path / "b" / "params.safetensors")
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k
    sa, _ = io.read_parquet(tmp_path / "a" / "stats.parquet")
    sb, _ = io.read_parquet(tmp_path / "b" / "stats.parquet")
    assert sa.loss.tolist() == sb.loss.tolist()


def test_resume_discards_blocks_of_other_settings(tmp_path):
    """Blocks saved under other settings are never reused: the run redoes them and equals a
    fresh run with the new settings."""
    lm = tiny_random_loaded("llama", layers=2)
    calibrate(lm, _fq(epochs=1), IDS, tmp_path / "old", batch_size=4, **QUIET)
    lines = []
    lm = tiny_random_loaded("llama", layers=2)
    calibrate(lm, _fq(epochs=2), IDS, tmp_path / "old", batch_size=4, log=lines.append)
    assert any("other settings" in line for line in lines)
    assert not any("resumed" in line for line in lines)
    lm = tiny_random_loaded("llama", layers=2)
    calibrate(lm, _fq(epochs=2), IDS, tmp_path / "new", batch_size=4, **QUIET)
    pa, _ = io.load_tensors(tmp_path / "old" / "params.safetensors")
    pb, _ = io.load_tensors(tmp_path / "new" / "params.safetensors")
    for k in pb:
        assert torch.equal(pa[k], pb[k]), k


def test_nan_detection_names_block(tmp_path):
    lm = tiny_random_loaded("llama", layers=3)
    with torch.no_grad():
        lm.blocks[1].mlp.up_proj.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="block 1"):
        calibrate(lm, _fq(epochs=1), IDS, tmp_path, batch_size=4, **QUIET)
    lm = tiny_random_loaded("llama", layers=2)
    m = _fq(epochs=1, lr=float("inf"))          # diverging optimiser
    with pytest.raises(NonFiniteError, match="block 0"):
        calibrate(lm, m, IDS, tmp_path / "x", batch_size=4, **QUIET)


def test_load_quantized_matches_calibrated_model(tmp_path):
    lm = tiny_random_loaded("qwen2", layers=2, kv_heads=2)
    calibrate(lm, _fq(epochs=1), IDS, tmp_path, batch_size=4, **QUIET)
    with torch.no_grad():
        y = lm.logits(IDS)
        y2 = load_quantized(tiny_random_loaded("qwen2", layers=2, kv_heads=2), tmp_path).logits(IDS)
        fp = tiny_random_loaded("qwen2", layers=2, kv_heads=2).logits(IDS)
    assert (y - y2).abs().max() < 1e-3 * fp.abs().max()
    assert (y - fp).abs().max() > 1e-2          # it is quantized
    with pytest.raises(FileNotFoundError):
        load_quantized(tiny_random_loaded("qwen2", layers=2, kv_heads=2), tmp_path / "nope")


def _tiny_model_dir(root):
    import random

    from fair_calib.models.tiny.tokenizer import train_tokenizer, wrap_fast

    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    texts = [" ".join(rng.choice(words) for _ in range(40)) + " ." for _ in range(20)]
    tok = wrap_fast(train_tokenizer(texts))
    lm = tiny_random_loaded("llama", layers=2, vocab=len(tok))
    mdir = root / "model"
    lm.model.save_pretrained(mdir)
    tok.save_pretrained(mdir)
    sdir = root / "synthetic"
    sdir.mkdir()
    (sdir / "calib.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return mdir, sdir


def test_cli_fair_calib_with_prior(tmp_path):
    import pandas as pd
    import pyarrow as pa

    from fair_calib.calibrate import run_cli

    mdir, sdir = _tiny_model_dir(tmp_path)
    prior = tmp_path / "prior.parquet"
    io.write_parquet(pd.DataFrame({"position": [0, 1, 2, 3], "w_bar": [1.0, 0.5, 0.25, 0.1]}),
                     prior, pa.schema([("position", pa.int32()), ("w_bar", pa.float64())]),
                     provenance={"floor": 0.05, "K": 4})
    settings = {"seed": 0, "device": "cpu", "dtype": "float32", "data_dir": str(tmp_path),
                "synthetic_dir": str(sdir),
                "model": {"name": "tiny-llada", "family": "tiny-llada"},
                "method": {"name": "fair-calib", "type": "fair_calib", "prior": "default",
                           "epochs": 1, "lr": 5e-3},
                "bits": {"name": "w4a4", "w_bits": 4, "a_bits": 4},
                "calibration": {"dataset": "synthetic", "n_samples": 4, "seq_len": 12,
                                "batch_size": 2}}
    out = tmp_path / "calib"
    with pytest.raises(ValueError, match="--prior"):
        run_cli(["--settings", json.dumps(settings), "--model-dir", str(mdir), "--out-dir", str(out)])
    run_cli(["--settings", json.dumps(settings), "--model-dir", str(mdir), "--prior", str(prior),
             "--out-dir", str(out)])
    meta = io.read_json(out / "meta.json")
    w = torch.tensor(meta["position_weights"])
    raw = torch.tensor([0.05] * 8 + [1.0, 0.5, 0.25, 0.1])   # window = last K positions
    assert torch.allclose(w, raw / raw.mean(), atol=1e-6)
    assert meta["method"] == "fair-calib" and meta["bits"]["name"] == "w4a4"
    assert meta["provenance"]["config"]["prior"] == str(prior)
    assert meta["export_bytes"] > 0 and meta["fp_bf16_bytes"] > 0
    df, _ = io.read_parquet(out / "stats.parquet")
    assert sorted(df.block.unique()) == [0, 1]
    _calibration_belongs_to_the_weights(mdir, out)


def _calibration_belongs_to_the_weights(mdir, out):
    """Issue 32: a model retrained at the same path must not take the old calibration."""
    from fair_calib.evaluate.lm import CalibrationMismatchError, check_calibration_pairing
    from fair_calib.jobs.model_identity import (CalibrationOfOtherWeightsError,
                                                check_calibration_content, content_id)
    from safetensors.torch import load_file, save_file

    made = io.read_json(out / "meta.json")["provenance"]["config"]["model_content"]
    assert made == f"sha256:{io.file_sha256(mdir / 'model.safetensors')}"
    check_calibration_pairing(str(out), str(mdir), "tiny-llada")        # its own weights
    weights = load_file(mdir / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1.0                                  # "retrained"
    save_file(weights, str(mdir / "model.safetensors"), metadata={"format": "pt"})
    now = content_id(mdir)
    assert now != made
    with pytest.raises(CalibrationMismatchError) as err:                 # lm-eval
        check_calibration_pairing(str(out), str(mdir), "tiny-llada")
    assert made in str(err.value) and now in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(CalibrationOfOtherWeightsError):                  # evaluate, trajectories
        check_calibration_content(out, mdir)


def _block_outputs(lm, ids):
    outs = {}
    hooks = [b.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, o[0] if isinstance(o, tuple) else o))
             for i, b in enumerate(lm.blocks)]
    with torch.no_grad():
        lm.model(input_ids=ids)
    for h in hooks:
        h.remove()
    return outs


def test_teacher_propagation_matches_quantized_inputs_to_fp_teacher_targets(tmp_path):
    """FAIR-Calib's default: block l sees the quantized model's hidden state and is matched to
    the FP model's h*_l; the recorded initial loss of block 1 is that MSE."""
    fp = _block_outputs(tiny_random_loaded("llama", layers=2), IDS)
    lm = tiny_random_loaded("llama", layers=2)
    method = make_method({"type": "fair_calib", "epochs": 0, "weighting": "uniform"}, 4, 4)
    assert method.training_settings()["propagate"] == "teacher"
    meta = calibrate(lm, method, IDS, tmp_path, batch_size=4, **QUIET)
    assert meta["propagate"] == "teacher"
    q = _block_outputs(lm, IDS)
    df, _ = io.read_parquet(tmp_path / "stats.parquet")
    want = sum(weighted_mse(q[1][s:s + 4], fp[1][s:s + 4], None).item() for s in (0, 4)) / 2
    got = df[(df.block == 1) & (df.epoch == -1)].loss.item()
    assert abs(got - want) < 1e-6 * want
    # the other readings give other losses: FP inputs (FlatQuant), or the FP block's outputs
    # on the quantized inputs as targets (propagate: quant)
    for other in ("fp", "quant"):
        m = make_method({"type": "fair_calib", "epochs": 0, "weighting": "uniform",
                         "propagate": other}, 4, 4)
        calibrate(tiny_random_loaded("llama", layers=2), m, IDS, tmp_path / other, batch_size=4, **QUIET)
        d, _ = io.read_parquet(tmp_path / other / "stats.parquet")
        assert abs(d[(d.block == 1) & (d.epoch == -1)].loss.item() - want) > 1e-3 * want, other


def test_uniform_fair_calib_with_fp_propagation_is_flatquant(tmp_path):
    res = []
    for mtype in ("flatquant", "fair_calib"):
        lm = tiny_random_loaded("llama", layers=2)
        cfg = {"type": mtype, "epochs": 2, "weighting": "uniform", "propagate": "fp"}
        calibrate(lm, make_method(cfg, 4, 4), IDS, tmp_path / mtype, batch_size=4, **QUIET)
        res.append(io.load_tensors(tmp_path / mtype / "params.safetensors")[0])
    assert res[0].keys() == res[1].keys()
    assert all(torch.equal(res[0][k], res[1][k]) for k in res[0])


def test_training_rebuilds_matrices_when_the_optimizer_hides_its_updates(tmp_path, monkeypatch):
    """Fused optimizers (AdamW(fused=True) on CUDA) update parameters without bumping their
    version counters, which key the transforms' matrix cache: every step must rebuild the
    matrices anyway. An optimizer that updates through ``.data`` does the same on CPU; with a
    stale cache the second step would backpropagate through the first step's freed graph."""
    import fair_calib.calibrate as cal

    class HiddenUpdates(torch.optim.SGD):
        @torch.no_grad()
        def step(self, closure=None):
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        p.data.sub_(g["lr"] * p.grad)      # no version bump, like a fused kernel
            return None

    def make_optimizer(method, block, tr, steps):
        opt = HiddenUpdates(method.param_groups(block, tr["lr"]), lr=tr["lr"])
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)

    monkeypatch.setattr(cal, "_make_optimizer", make_optimizer)
    lm = tiny_random_loaded("llama", layers=1)
    meta = calibrate(lm, _fq(epochs=2, lr=1e-2), IDS, tmp_path, batch_size=4, **QUIET)
    losses = [r["loss"] for r in meta_rows(tmp_path)]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert meta["n_blocks"] == 1


def meta_rows(out_dir):
    df, _ = io.read_parquet(out_dir / "stats.parquet")
    return df.sort_values(["block", "epoch"]).to_dict("records")


def test_content_id_of_tiny_sharded_and_cached_checkpoints(tmp_path):
    import hashlib

    from fair_calib.jobs.model_identity import content_id

    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "model.safetensors").write_bytes(b"weights")
    assert content_id(tiny) == f"sha256:{hashlib.sha256(b'weights').hexdigest()}"
    (tiny / "fair_calib.json").write_text(json.dumps({"model_sha256": "ab" * 32}))
    # what train-tiny recorded is not taken on trust: the weights may have changed since
    assert content_id(tiny) == f"sha256:{hashlib.sha256(b'weights').hexdigest()}"
    # a hub cache snapshot: shards are symlinks to blobs named by their sha256 (not reread)
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots/rev"
    blobs.mkdir()
    snap.mkdir(parents=True)
    for i, sha in enumerate(("1" * 64, "2" * 64)):
        (blobs / sha).write_bytes(b"not what the name says")
        (snap / f"model-0000{i + 1}-of-00002.safetensors").symlink_to(blobs / sha)
    lines = f"model-00001-of-00002.safetensors {'1' * 64}\nmodel-00002-of-00002.safetensors {'2' * 64}\n"
    assert content_id(snap) == f"sha256:{hashlib.sha256(lines.encode()).hexdigest()}"
    assert content_id(tmp_path / "absent") is None and content_id("org/not-cached-model") is None


def test_weights_hash_is_recomputed_unless_the_files_stat_is_unchanged(tmp_path, monkeypatch):
    """Issue 42: a calibration is tied to the weights it was made on whatever changed them; the
    hash of a file is read from the cache only while its size, mtime, ctime and inode are
    those recorded with it, so an unchanged checkpoint is not read twice."""
    import hashlib
    import os

    from fair_calib.jobs import model_identity as mi

    reads = []
    real_read = mi._read_sha256
    monkeypatch.setattr(mi, "_read_sha256", lambda p: reads.append(p) or real_read(p))
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    f = tiny / "model.safetensors"
    f.write_bytes(b"weights A")
    a = f"sha256:{hashlib.sha256(b'weights A').hexdigest()}"
    assert mi.content_id(tiny) == a and len(reads) == 1
    assert mi.content_id(tiny) == a and len(reads) == 1            # unchanged: not read again
    assert mi.hash_cache_path().is_file()                           # the test's own (conftest)
    # the cache is what answered: an entry of the same stat is believed ...
    cache = json.loads(mi.hash_cache_path().read_text())
    cache["files"][os.path.realpath(f)]["sha256"] = "c" * 64
    mi.hash_cache_path().write_text(json.dumps(cache))
    assert mi.content_id(tiny) == f"sha256:{'c' * 64}" and len(reads) == 1
    # ... and one whose size or mtime differ is not
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    assert mi.content_id(tiny) == a and len(reads) == 2
    # changed in place, same size, mtime set back to what it was (as cp -p, rsync -t do)
    st = f.stat()
    with open(f, "r+b") as fh:
        fh.write(b"W")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    assert mi.content_id(tiny) == f"sha256:{hashlib.sha256(b'Weights A').hexdigest()}"
    assert len(reads) == 3


def test_an_unwritable_hash_cache_only_costs_a_read(tmp_path, monkeypatch):
    import hashlib

    from fair_calib.jobs import model_identity as mi

    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv(mi.HASH_CACHE_ENV, str(blocked / "sha256.json"))   # under a file
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors").write_bytes(b"w")
    assert mi.content_id(tmp_path / "m") == f"sha256:{hashlib.sha256(b'w').hexdigest()}"
