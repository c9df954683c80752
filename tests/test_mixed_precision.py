"""Mixed precision: every op takes bfloat16 and float16 (pygpt.ops.precision), each follows its
autocast policy, and a run in bfloat16 or float16 (pygpt.mixed_precision) trains, resumes
exactly and saves float32 weights."""
import dataclasses
import json
import math

import pytest
import torch

import pygpt
import pygpt.ops as ops
from test_op_contract import CONTRACTS
from helpers import TINY_FLAGS, TINY_MODEL, metrics, state_dicts_equal, tiny_train_cfg, train_cli
from pygpt.models import GPT
from pygpt.ops.precision import Policy, compute_dtype
from pygpt.storage.run_files import CONFIG, TRAIN_STATE
from pygpt.training import train
from pygpt.training.step import Diverged, train_step

LOW = (torch.bfloat16, torch.float16)


FIXED_TABLES = ("cos", "sin")  # rotary's: they get no gradient


def _low(contract, dtype):
    """The contract's good arguments in dtype (indices stay int64), differentiable but for
    rotary's tables."""
    torch.manual_seed(0)
    return tuple(t.to(dtype).requires_grad_(name not in FIXED_TABLES)
                 if t is not None and t.is_floating_point() else t
                 for name, t in zip(contract.arg_names, contract.good()))


def _float32(args):
    return tuple(a.detach().float().requires_grad_(a.requires_grad)
                 if a is not None and a.is_floating_point() else a for a in args)


def _outputs(result):
    return result if isinstance(result, tuple) else (result,)


def _lce_call(*args):
    return ops.linear_cross_entropy(*args)


def _lce_args(dtype):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(9, 16, generator=g).to(dtype).requires_grad_(),
            torch.randn(30, 16, generator=g).to(dtype).requires_grad_(),
            torch.randint(0, 30, (9,), generator=g))


# Every op's call: the op contracts' (tests/test_op_contract.py) and the fused LM head's.
CALLS = {key: (lambda *a, c=c: c.call("public", *a), lambda dtype, c=c: _low(c, dtype))
         for key, c in CONTRACTS.items()}
CALLS[ops.linear_cross_entropy.__name__] = (_lce_call, _lce_args)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name", list(CALLS))
def test_low_precision_inputs_compute_in_float32(name, dtype):
    """bfloat16 and float16 inputs on the CPU: the result and gradients in the input's type,
    equal to the float32 op on the same values rounded once to that type."""
    call, make = CALLS[name]
    args = make(dtype)
    outs = _outputs(call(*args))
    wide = _float32(args)
    refs = _outputs(call(*wide))
    for out, ref in zip(outs, refs):
        assert out.dtype == dtype
        torch.testing.assert_close(out, ref.to(dtype), rtol=0, atol=0)
    sum(o.float().sum() for o in outs).backward()
    sum(r.sum() for r in refs).backward()
    for a, w in zip(args, wide):
        if a is not None and a.requires_grad:
            assert a.grad.dtype == dtype
            torch.testing.assert_close(a.grad, w.grad.to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_autocast_policy_on_the_cpu(dtype):
    """Under CPU autocast each op computes in float32 (the CPU kernels' type): low-policy ops
    for want of a low kernel, float32-policy ops by policy; the result is float32 and equal to
    the op on the inputs in float32."""
    for name, (call, make) in CALLS.items():
        args = make(dtype)
        with torch.autocast("cpu", dtype=dtype):
            outs = _outputs(call(*args))
        refs = _outputs(call(*_float32(args)))
        for out, ref in zip(outs, refs):
            assert out.dtype == torch.float32, name
            torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_compute_dtype_rule():
    """The rule by device and policy, outside and inside autocast."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert compute_dtype(torch.bfloat16, cpu, Policy.LOW) == torch.float32
    assert compute_dtype(torch.float64, cpu, Policy.LOW) == torch.float64
    assert compute_dtype(torch.bfloat16, cuda, Policy.LOW) == torch.bfloat16  # a CUDA kernel
    assert compute_dtype(torch.float16, cuda, Policy.LOW) == torch.float16
    assert compute_dtype(torch.float64, cuda, Policy.LOW) == torch.float32  # none: float32
    assert compute_dtype(torch.float32, torch.device("meta"), Policy.LOW) == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compute_dtype(torch.float32, cpu, Policy.LOW) == torch.float32
        assert compute_dtype(torch.bfloat16, cpu, Policy.FLOAT32) == torch.float32
        assert compute_dtype(torch.float64, cpu, Policy.FLOAT32) == torch.float64


def test_mixed_types_outside_autocast_are_still_refused():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(RuntimeError, match="k"):
        ops.attention(q, q.bfloat16(), q)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_a_gpt_under_autocast_matches_the_torch_kernels(dtype):
    """The same model on our kernels and on plain PyTorch, both under CPU autocast: the loss and
    every gradient agree to the low type's precision (the matmuls are the same bfloat16 or
    float16 ones; our ops compute in float32, PyTorch's by its own autocast lists)."""
    cfg = dataclasses.replace(TINY_MODEL, block_size=16, n_layer=2, n_embd=32, n_head=4,
                              vocab_size=50)
    torch.manual_seed(0)
    ours = GPT(cfg, kernels="ext")
    theirs = GPT(cfg, kernels="torch")
    theirs.load_state_dict(ours.state_dict())
    idx = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(1))
    losses = []
    for model in (ours, theirs):
        with torch.autocast("cpu", dtype=dtype):
            out = model(idx, targets=idx)
        out.loss.backward()
        losses.append(out.loss)
    eps = torch.finfo(dtype).eps
    assert abs(losses[0].item() - losses[1].item()) < 8 * eps * abs(losses[1].item())
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        scale = b.grad.abs().max().item()
        assert (a.grad - b.grad).abs().max().item() <= 16 * eps * scale + 1e-6, name
        assert a.dtype == torch.float32  # the weights stay float32


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_resume_equals_straight_in_low_precision(text_file, tmp_path, dtype):
    """6 steps then resumed to 10 equals 10 straight, bit for bit, in each low type (float16's
    loss scale comes back with the run); the weights are saved in float32 and config.json
    records the type."""
    common = dict(lr_decay_iters=10, eval_interval=3, dtype=dtype)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(TINY_MODEL, tiny_train_cfg(text_file, straight, max_iters=10, **common),
          progress=False)
    train(TINY_MODEL, tiny_train_cfg(text_file, resumed, max_iters=6, **common), progress=False)
    train(TINY_MODEL, tiny_train_cfg(text_file, resumed, max_iters=10, **common), resume=True,
          progress=False)
    model_s, _ = pygpt.load(straight)
    model_r, _ = pygpt.load(resumed)
    state_dicts_equal(model_s.state_dict(), model_r.state_dict())
    assert all(t.dtype == torch.float32 for t in model_s.state_dict().values()
               if t.is_floating_point())
    assert [r["val_loss"] for r in metrics(straight)] == [r["val_loss"] for r in metrics(resumed)]
    assert json.loads((straight / CONFIG).read_text())["train"]["dtype"] == dtype
    state = torch.load(resumed / TRAIN_STATE, weights_only=True)
    assert ("grad_scale" in state) == (dtype == "float16")


def test_bfloat16_trains_as_float32_does(text_file, tmp_path):
    """60 steps of the tiny run in bfloat16 land within a few hundredths of float32's val loss."""
    losses = {}
    for dtype in ("float32", "bfloat16"):
        result = train(TINY_MODEL, tiny_train_cfg(text_file, tmp_path / dtype, max_iters=60,
                                                  eval_interval=60, eval_iters=8, dtype=dtype),
                       progress=False)
        losses[dtype] = result["val_loss"]
    assert losses["float32"] < 3.5  # it learned something
    assert abs(losses["bfloat16"] - losses["float32"]) < 0.03, losses


def test_the_cli_prints_and_records_the_dtype(text_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_cli(["--data", str(text_file), "--out", str(out),
                      *[f for f in TINY_FLAGS if f != "--quiet"], "--dtype", "bfloat16"]) \
        == (0, None)
    assert "; bfloat16 on cpu (" in capsys.readouterr().out
    assert json.loads((out / CONFIG).read_text())["train"]["dtype"] == "bfloat16"


def test_an_old_run_resumes_in_float32(text_file, tmp_path):
    """A config.json from before --dtype (no dtype) resumes as the float32 run it was."""
    out = tmp_path / "run"
    assert train_cli(["--data", str(text_file), "--out", str(out), *TINY_FLAGS]) == (0, None)
    config = json.loads((out / CONFIG).read_text())
    del config["train"]["dtype"]
    (out / CONFIG).write_text(json.dumps(config))
    assert train_cli(["--resume", "--out", str(out), "--max-iters", "6", "--quiet"]) == (0, None)
    assert json.loads((out / CONFIG).read_text())["train"]["dtype"] == "float32"


def test_a_device_without_autocast_is_refused(text_file, tmp_path):
    assert train_cli(["--data", str(text_file), "--out", str(tmp_path / "x"), *TINY_FLAGS,
                      "--device", "meta", "--dtype", "bfloat16"]) \
        == (1, "error: --dtype bfloat16 runs on cpu or cuda, not meta")


def _tiny_step_parts(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    class Out:
        def __init__(self, loss):
            self.loss = loss

    return model, optimizer, lambda x, big: Out(model(x).sum() * big)


def test_float16_overflow_skips_the_step_and_lowers_the_scale():
    """A scaled gradient that overflows: the weights stay, the scale halves, no Diverged; a
    non-finite loss is still a divergence."""
    model, optimizer, forward = _tiny_step_parts()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    before = [p.detach().clone() for p in model.parameters()]
    batch = {"x": torch.ones(2, 4), "big": torch.tensor(1e38)}
    train_step(model, optimizer, [batch], lr=0.1, grad_clip=1.0, forward=forward,
               inputs=lambda b: b, scaler=scaler)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert scaler.get_scale() == 2.0**15
    train_step(model, optimizer, [{"x": torch.ones(2, 4), "big": torch.tensor(1.0)}], lr=0.1,
               grad_clip=1.0, forward=forward, inputs=lambda b: b, scaler=scaler)
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(Diverged):
        train_step(model, optimizer, [{"x": torch.ones(2, 4), "big": torch.tensor(math.inf)}],
                   lr=0.1, grad_clip=1.0, forward=forward, inputs=lambda b: b, scaler=scaler)



# --- the commands ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    from serve_helpers import tiny_gpt

    return tiny_gpt(tmp_path_factory.mktemp("dtype"))


def _log_softmax(ckpt, text, dtype):
    """The checkpoint's next-token log-probabilities after each prefix of text, in dtype."""
    from pygpt.mixed_precision import autocast

    model, tokenizer = pygpt.load(ckpt)
    with torch.inference_mode(), autocast("cpu", dtype):
        logits = model(torch.tensor([tokenizer.encode(text)])).logits[0]
    return logits.double().log_softmax(-1), tokenizer.encode(text)


def test_serve_ckpt_computes_in_its_dtype(tiny_ckpt, tmp_path):
    """serve --ckpt --dtype bfloat16: a completion's prompt scores are the model's under
    bfloat16 autocast (the decode worker's thread computes in it), not its float32 ones."""
    from serve_helpers import Server

    server = Server(tiny_ckpt, tmp_path, "--dtype", "bfloat16", source="--ckpt")
    try:
        prompt = "First Citizen: w"
        answer = server.client.post("/v1/completions", json={
            "prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0})
        assert answer.status_code == 200, answer.text
        got = answer.json()["choices"][0]["logprobs"]["token_logprobs"][1:len(prompt)]
    finally:
        assert "Traceback" not in server.stop()[1]
    low, ids = _log_softmax(tiny_ckpt, prompt, "bfloat16")
    wide, _ = _log_softmax(tiny_ckpt, prompt, "float32")
    want_low = [low[t - 1, ids[t]].item() for t in range(1, len(ids))]
    want_wide = [wide[t - 1, ids[t]].item() for t in range(1, len(ids))]
    assert got == pytest.approx(want_low, abs=1e-4)
    assert max(abs(a - b) for a, b in zip(got, want_wide)) > 1e-3


def test_serve_dtype_is_for_a_checkpoint():
    from pygpt.serve import command
    from serve_helpers import command_error

    assert "--dtype is for a checkpoint" in command_error("--dtype", "bfloat16",
                                                          main=command.main)


def test_generate_computes_in_its_dtype(tiny_ckpt, capsys):
    """pygpt.generate --dtype bfloat16 --greedy prints the model's greedy text under bfloat16
    autocast."""
    import pygpt.generate
    from pygpt.mixed_precision import autocast

    pygpt.generate.main(["--ckpt", str(tiny_ckpt), "--prompt", "First", "--greedy",
                         "--max-new-tokens", "30", "--dtype", "bfloat16"])
    printed = capsys.readouterr().out
    model, tokenizer = pygpt.load(tiny_ckpt)
    with torch.inference_mode(), autocast("cpu", "bfloat16"):
        ids = model.generate(torch.tensor([tokenizer.encode("First")]), 30,
                             sampling=pygpt.decoding.sampling.Sampling(greedy=True))
    assert printed.rstrip("\n") == tokenizer.decode(ids[0].tolist())


def test_a_gpt_compiles_whole_under_autocast():
    """torch.compile(fullgraph=True) of a GPT under bfloat16 autocast: the ops' precision rule
    traces without a graph break and gives eager's loss and gradients."""
    cfg = dataclasses.replace(TINY_MODEL, block_size=16, vocab_size=40)
    torch.manual_seed(0)
    eager = GPT(cfg)
    compiled_model = GPT(cfg)
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model, fullgraph=True)
    idx = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(1))
    losses = []
    for forward in (eager, compiled):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = forward(idx, targets=idx).loss
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[1], losses[0])
    for a, b in zip(eager.parameters(), compiled_model.parameters()):
        torch.testing.assert_close(b.grad, a.grad)
