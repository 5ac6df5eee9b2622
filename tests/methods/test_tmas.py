"""DLLMQuant's Temporal-Mask Adaptive Sampling (``tmas``), checked against the paper's recipe
written out here: states of the FP model's own denoising trajectory (not random masks), the
timeline cut into four contiguous stages with the sampling proportion [0.3, 0.2, 0.2, 0.3]
(largest remainder), evenly spaced snapshots inside a stage, and a full FlatQuant calibration
on the snapshots for both families' layouts."""
import pytest
import torch

from fair_calib.calibrate import calibrate, calibration_generator
from fair_calib.decoding import generate, make_policy
from fair_calib.methods import load_quantized, make_method
from fair_calib.quant.toy import tiny_random_loaded

torch.set_num_threads(1)
LAYOUTS = {"llada": ("llama", "tiny-llada"), "dream": ("qwen2", "tiny-dream")}
L, PROMPT = 32, 8            # prompt_ratio 0.25: 8 prompt tokens, a 24-token window, 24 steps


def loaded(layout="llada"):
    arch, family = LAYOUTS[layout]
    return tiny_random_loaded(arch, layers=2, family=family)


def windows(n, seed=1):
    return torch.randint(0, 60, (n, L), generator=torch.Generator().manual_seed(seed))


class AllStates:
    """Every input state of a decoding (the window at the start of each step)."""

    def __init__(self, mask_id):
        self.mask_id, self.states = mask_id, []

    def start(self, batch, gen_length, steps):
        pass

    def step(self, t, logits, masked, committed, window):
        self.states.append(torch.where(masked, torch.full_like(window, self.mask_id), window))

    def finish(self, tokens):
        pass


def trajectory(lm, ids):
    """The FP teacher's own trajectory of each window's rest: [n, T, L - PROMPT]."""
    rec = AllStates(lm.mask_id)
    policy = make_policy(lm, gen_length=L - PROMPT, steps=L - PROMPT)
    generate(lm, [r[:PROMPT].tolist() for r in ids], policy, recorder=rec)
    return torch.stack(rec.states, dim=1)


def which_steps(out, ids, traj):
    steps = []
    for r in range(len(ids)):
        assert torch.equal(out[r, :PROMPT], ids[r, :PROMPT])            # the prompt as given
        hits = [s for s in range(traj.shape[1]) if torch.equal(traj[r, s], out[r, PROMPT:])]
        assert hits, f"row {r} is no state of its own trajectory"
        steps.append(hits[0])
    return steps


@pytest.mark.parametrize("n, counts", [(10, [3, 2, 2, 3]), (4, [1, 1, 1, 1]), (7, [2, 2, 1, 2]),
                                       (20, [6, 4, 4, 6])])
def test_states_of_the_models_own_trajectory_by_stage(n, counts):
    """n * [0.3, 0.2, 0.2, 0.3] by largest remainder (ties to the earlier stage); stage j covers
    steps [6j, 6j + 6) of the 24; its c snapshots at 6j + floor((i + 1/2) 6 / c). With LLaDA's
    one token a step, the state at step s has 24 - s masked window positions."""
    lm, ids = loaded(), windows(n)
    out, w = make_method({"type": "tmas"}, 4, 4).calibration_inputs(lm, ids, calibration_generator(0))
    assert w is None and out.shape == ids.shape
    steps = which_steps(out, ids, trajectory(lm, ids))
    want = []
    for j, c in enumerate(counts):
        want += [6 * j + int((i + 0.5) * 6 / c) for i in range(c)]
    assert sorted(steps) == sorted(want)
    for r, s in enumerate(steps):
        assert int((out[r, PROMPT:] == lm.mask_id).sum()) == 24 - s


def matches(hits, want):
    """Whether rows (each with the steps its state equals) can take the wanted steps one each
    (a state can repeat along a trajectory: Dream's count rule may commit nothing in a step)."""
    owner = {}

    def take(r, seen):
        for j, s in enumerate(want):
            if s in hits[r] and j not in seen:
                seen.add(j)
                if j not in owner or take(owner[j], seen):
                    owner[j] = r
                    return True
        return False
    return all(take(r, set()) for r in range(len(hits)))


def test_dream_layout_snapshots_its_entropy_trajectory():
    lm, ids = loaded("dream"), windows(10)
    out, _ = make_method({"type": "tmas"}, 4, 4).calibration_inputs(lm, ids, calibration_generator(0))
    traj = trajectory(lm, ids)
    hits = [{s for s in range(24) if torch.equal(traj[r, s], out[r, PROMPT:])} for r in range(10)]
    assert all(hits) and matches(hits, [1, 3, 5, 7, 10, 13, 16, 19, 21, 23])
    assert not matches(hits, [0] * 10)


def test_stage_proportions_setting():
    lm, ids = loaded(), windows(6)
    m = make_method({"type": "tmas", "stage_proportions": [0.5, 0.5]}, 4, 4)
    out, _ = m.calibration_inputs(lm, ids, calibration_generator(0))
    # two stages of 12 steps, three snapshots each at 12j + floor((i + 1/2) 4)
    assert sorted(which_steps(out, ids, trajectory(lm, ids))) == [2, 6, 10, 14, 18, 22]


def test_same_seed_same_bits_other_seed_other_assignment():
    lm, ids = loaded(), windows(8)
    run = lambda seed: make_method({"type": "tmas"}, 4, 4).calibration_inputs(  # noqa: E731
        lm, ids, calibration_generator(seed))[0]
    a, b, c = run(5), run(5), run(6)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("bad", [{"prompt_ratio": 0.0}, {"stage_proportions": [0.5, 0.4]},
                                 {"stage_proportions": [1.2, -0.2]}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match="tmas"):
        make_method({"type": "tmas", **bad}, 4, 4)


def test_window_is_whole_blocks_or_the_given_length():
    """LLaDA's block policy (block 8): seq_len 40 leaves 30 after a 10-token prompt, cut to 24
    (3 blocks) and a 16-token prompt; ``decoding.gen_length`` sets the window outright."""
    lm = loaded()
    assert make_method({"type": "tmas"}, 4, 4).policy(lm, 40).gen_length == 24
    p = make_method({"type": "tmas", "decoding": {"gen_length": 16, "steps": 8}}, 4, 4).policy(lm, 40)
    assert (p.gen_length, p.steps, p.block_length) == (16, 8, 8)
    assert make_method({"type": "tmas"}, 4, 4).policy(loaded("dream"), 40).gen_length == 30
    with pytest.raises(ValueError, match="tmas"):
        make_method({"type": "tmas", "decoding": {"gen_length": 40}}, 4, 4).policy(lm, 40)


@pytest.mark.parametrize("layout", ["llada", "dream"])
def test_calibrates_end_to_end(tmp_path, layout):
    ids = windows(4)
    m = make_method({"type": "tmas", "epochs": 1}, 4, 4, seed=0)
    rows, _ = m.calibration_inputs(loaded(layout), ids, calibration_generator(0))
    meta = calibrate(loaded(layout), m, rows, tmp_path, batch_size=4, log=lambda s: None)
    assert meta["type"] == "tmas" and meta["n_samples"] == 4 and meta["n_blocks"] == 2
    q = load_quantized(loaded(layout), tmp_path)
    with torch.no_grad():
        assert bool(torch.isfinite(q.logits(rows)).all())
