"""fair_calib.triton_launch: Triton's own launch the first time per specialisation, then the
compiled kernel called directly with the same arguments Triton's launch passes it."""
import pytest
import torch

triton = pytest.importorskip("triton")
from fair_calib import triton_launch as tlaunch  # noqa: E402


class Compiled:
    packed_metadata = "meta"
    function = "fn"

    def __init__(self, log):
        self.log = log

    def run(self, *a):
        self.log.append(("direct", a))


class Kernel:
    """A stand-in for a JITFunction: kernel[grid](*args, **kw) compiles (logged) and launches."""
    arg_names = ["x_ptr", "n", "scale", "BLOCK", "FLAG"]

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.log.append(("triton", grid, args, kw))
            return Compiled(self.log)
        return run


class Driver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 1234


@pytest.fixture
def fake_gpu(monkeypatch):
    driver = tlaunch.driver
    monkeypatch.setattr(tlaunch, "_on_gpu", lambda t: True)
    monkeypatch.setattr(tlaunch, "_COMPILED", {})
    saved = driver._active
    driver.set_active(Driver())
    yield
    driver._active = saved


def test_arg_spec_is_what_triton_specialises_on():
    x = torch.zeros(64, dtype=torch.bfloat16)
    assert tlaunch.arg_spec(x) == (torch.bfloat16, True)
    assert tlaunch.arg_spec(x[1:]) == (torch.bfloat16, False)      # 2 bytes off: not aligned
    assert tlaunch.arg_spec(1) == (True, False, False)
    assert tlaunch.arg_spec(32) == (False, True, False)
    assert tlaunch.arg_spec(2 ** 31) == (False, True, True)
    assert tlaunch.arg_spec(0.5) is None


def test_the_compiled_kernel_is_called_directly_after_the_first_launch(fake_gpu):
    k = Kernel()
    x = torch.zeros(64)
    tlaunch.launch(k, 7, (x, 48, 0.5), dict(FLAG=True, BLOCK=128), dict(num_warps=4))
    tlaunch.launch(k, 9, (x, 64, 2.0), dict(FLAG=True, BLOCK=128), dict(num_warps=4))
    assert [e[0] for e in k.log] == ["triton", "direct"]
    assert k.log[0] == ("triton", (7,), (x, 48, 0.5), dict(FLAG=True, BLOCK=128, num_warps=4))
    # grid, stream, function, metadata, no launch metadata or hooks, then every argument in
    # the kernel's parameter order, constexprs included (as Triton's own launch passes them)
    assert k.log[1][1] == (9, 1, 1, 1234, "fn", "meta", None, None, None, x, 64, 2.0, 128, True)


@pytest.mark.parametrize("change", ["unaligned", "n_is_1", "n_not_16", "const", "warps"])
def test_a_different_specialisation_goes_through_triton_again(fake_gpu, change):
    k = Kernel()
    x = torch.zeros(64)
    args, consts, opts = (x, 48, 0.5), dict(BLOCK=128, FLAG=True), dict(num_warps=4)
    tlaunch.launch(k, 1, args, consts, opts)
    args2 = {"unaligned": (x[1:], 48, 0.5), "n_is_1": (x, 1, 0.5),
             "n_not_16": (x, 40, 0.5)}.get(change, args)
    consts2 = dict(BLOCK=256, FLAG=True) if change == "const" else consts
    opts2 = dict(num_warps=8) if change == "warps" else opts
    tlaunch.launch(k, 1, args2, consts2, opts2)
    assert [e[0] for e in k.log] == ["triton", "triton"]


def test_cpu_tensors_hooks_and_the_switch_take_tritons_path(monkeypatch):
    k = Kernel()
    x = torch.zeros(64)
    for _ in range(2):                                          # CPU: never cached
        tlaunch.launch(k, 1, (x, 16, 0.5), dict(BLOCK=128, FLAG=True), {})
    monkeypatch.setattr(tlaunch, "_on_gpu", lambda t: True)
    monkeypatch.setattr(tlaunch, "DIRECT_LAUNCH", False)
    tlaunch.launch(k, 1, (x, 16, 0.5), dict(BLOCK=128, FLAG=True), {})
    assert [e[0] for e in k.log] == ["triton"] * 3


def test_an_installed_launch_hook_takes_tritons_path(fake_gpu):
    from triton import knobs
    k = Kernel()
    x = torch.zeros(64)
    hook = lambda *a: None                                     # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        for _ in range(2):
            tlaunch.launch(k, 1, (x, 16, 0.5), dict(BLOCK=128, FLAG=True), {})
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert [e[0] for e in k.log] == ["triton"] * 2
