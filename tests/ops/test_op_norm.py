"""ddpd.ops.norm: the Triton kernel (interpreter) agrees with the torch reference in every
dtype, for layer and RMS norms, with and without affine parameters and the adaLN
modulation, from strided views and at widths and row counts that fill no block; the
reference is the arithmetic the networks' norms had (nn.LayerNorm, then the modulation);
bad arguments, gradients, opcheck and torch.compile."""
import pytest
import torch
import torch.nn.functional as F

from ddpd.models.backbone import LayerNorm, RMSNorm
from ddpd.ops import norm
from ddpd.ops.norm import MAX_KERNEL_WIDTH, norm_launch, norm_triton
from ddpd.ops.reference import norm as norm_reference
from oracles.devices import MISMATCHES, fake_tensors, moved


def inputs(shape, dtype, seed=0, modulated=True, affine=True):
    """x with an offset and spread per row (the mean matters), float32 norm parameters as
    the networks keep them, shift and scale as adaLN's chunks of one projection (views)."""
    g = torch.Generator().manual_seed(seed)
    width = shape[-1]
    x = (torch.randn(shape, generator=g) * 3 + torch.randn(shape[:-1] + (1,), generator=g) * 5).to(dtype)
    weight = torch.randn(width, generator=g) if affine else None
    bias = torch.randn(width, generator=g) if affine else None
    if not modulated:
        return x, weight, bias, None, None
    chunks = (torch.randn(shape[0], 1, 2 * width, generator=g) * 0.5).to(dtype)
    shift, scale = chunks.chunk(2, dim=-1)
    return x, weight, bias, shift, scale


def exact(x, weight, bias, eps, rms, shift, scale):
    """The law in float64, unrounded."""
    x = x.double()
    if rms:
        n = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    else:
        n = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    n = n * (1 if weight is None else weight.double()) + (0 if bias is None else bias.double())
    if scale is not None:
        per_sequence = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
        n = n * (1 + scale.double().reshape(per_sequence)) + shift.double().reshape(per_sequence)
    return n


def assert_rounded_from(got, want64, dtype, ulps):
    """got is want64 rounded to dtype, give or take `ulps` units of its last place (of 1
    below 1: the centred values near 0 carry the statistics' absolute error)."""
    assert got.dtype == dtype
    tolerance = ulps * torch.finfo(dtype).eps * want64.abs().clamp_min(1.0)
    assert ((got.double() - want64).abs() <= tolerance).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("modulated", [False, True])
@pytest.mark.parametrize("shape", [(2, 37, 48), (1, 1, 1), (3, 5, 300), (4, 16), (2, 3, 4, 24)])
def test_kernel_agrees_with_the_reference(dtype, rms, modulated, shape):
    x, weight, bias, shift, scale = inputs(shape, dtype, modulated=modulated)
    bias = None if rms else bias
    got = norm_triton(x, weight, bias, 1e-5, rms=rms, shift=shift, scale=scale)
    want = norm_reference(x, weight, bias, 1e-5, rms=rms, shift=shift, scale=scale)
    assert got.shape == x.shape and got.is_contiguous()
    truth = exact(x, weight, bias, 1e-5, rms, shift, scale)
    assert_rounded_from(want, truth, dtype, 1 if dtype != torch.float32 else 64)
    assert_rounded_from(got, truth, dtype, 1 if dtype != torch.float32 else 64)
    if dtype != torch.float32:  # one rounding of nearly the same float32: the same value but for near-ties
        assert (got != want).float().mean() < 0.05


def test_strided_rows_and_parameters_without_affine():
    """x a view with strided rows (a slice of channels), no weight or bias, and shift/scale
    given as [B, H] rows of a wider tensor."""
    base = torch.randn(3, 10, 64)
    x = base[..., 8:40]
    mods = torch.randn(3, 96)
    shift, scale = mods[:, :32], mods[:, 64:]
    got = norm_triton(x, None, None, 1e-6, shift=shift, scale=scale)
    assert torch.allclose(got, norm_reference(x, None, None, 1e-6, shift=shift, scale=scale), atol=1e-5)
    assert torch.allclose(norm_triton(x, None, None, 1e-6, rms=True), norm_reference(x, None, None, 1e-6, rms=True),
                          atol=1e-5)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's numpy
@pytest.mark.parametrize("value,width,dtype", [(12345.678, 3, torch.float32), (1e15, 5, torch.float32),
                                               (-10.3359375, 16383, torch.float16), (3.0, 40, torch.bfloat16)])
def test_constant_rows_normalise_to_the_bias(value, width, dtype):
    """Whatever the row's float32 sum rounds to (12345.678 * 3 is not exact): the mean's
    rounding error must not become a variance. With eps = 0 a constant row is NaN, as in
    the reference."""
    x = torch.full((2, width), value, dtype=dtype)
    bias = torch.randn(width)
    assert torch.equal(norm_triton(x, torch.randn(width), bias, 1e-5), bias.to(dtype).expand(2, width))
    assert torch.equal(norm_triton(x, None, None, 1e-5, rms=False), torch.zeros(2, width, dtype=dtype))
    assert norm_triton(x, None, None, 0.0).isnan().all() and norm_reference(x, None, None, 0.0).isnan().all()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's numpy, on purpose
def test_rows_whose_squares_overflow_are_nan_as_in_the_reference():
    """A spread beyond about 1e19 overflows the float32 variance (or mean square): NaN, in the
    kernel and the reference, not the bias a zero inverse deviation would give silently."""
    x = torch.tensor([[1.7e38, -2.8e38, 0.0, 1.0], [1.0, 2.0, 3.0, 4.0]])
    bias = torch.ones(4)
    for rms in (False, True):
        got, want = norm_triton(x, None, bias, 1e-5, rms=rms), norm_reference(x, None, bias, 1e-5, rms=rms)
        assert got[0].isnan().all() and want[0].isnan().all()
        assert torch.allclose(got[1], want[1])


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's numpy, on purpose
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_a_layer_norm_whose_variance_overflows_is_nan_on_every_path():
    """torch's layer_norm gives a row whose variance overflows float32 a zero inverse
    deviation, hence the bias silently, where the kernel gives NaN: the reference gives NaN
    too, traced or not. A row of huge values that barely spread (its float32 sum overflows)
    is NaN in torch's statistics but normalises in the kernel's pivoted ones (docs/ops/norm.md)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.tensor([[1e38, -1e38, 0.0, 0.0], [1e20, -1e20, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]])
    bias = torch.ones(4)
    got, want = norm_triton(x, None, bias, 1e-5), norm_reference(x, None, bias, 1e-5)
    traced = make_fx(lambda t: norm_reference(t, None, bias, 1e-5))(x)(x)
    for out in (got, want, traced):
        assert out[:2].isnan().all() and torch.allclose(out[2], F.layer_norm(x[2], (4,), None, bias))
    huge = torch.full((1, 4), 3e38)
    assert torch.equal(norm_triton(huge, None, bias, 1e-5), bias[None]) and norm_reference(huge).isnan().all()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's numpy
def test_special_rows():
    """A constant row normalises to the bias (no NaN from its zero variance); inf or NaN in
    a row makes that row NaN and leaves its neighbours alone; rows of large values (whose
    squares still fit float32, as in the reference) normalise as the others."""
    x = torch.randn(6, 40)
    x[0] = 7.0
    x[1, 3] = float("inf")
    x[2, 5] = float("nan")
    x[3] = torch.randn(40) * 1e15
    weight, bias = torch.randn(40), torch.randn(40)
    got = norm_triton(x, weight, bias, 1e-5)
    want = norm_reference(x, weight, bias, 1e-5)
    assert torch.allclose(got[0], bias) and got[1:3].isnan().all()
    assert torch.allclose(got[3:], want[3:], atol=1e-5) and torch.isfinite(got[3:]).all()


def test_the_networks_norms_keep_their_arithmetic():
    """On the CPU the networks' norms are the torch code they were: nn.LayerNorm (float32
    statistics for bf16) then x * (1 + scale) + shift; RMSNorm the usual formula. The
    pinned sampling tests depend on float32 staying bit for bit."""
    torch.manual_seed(0)
    x, _, _, shift, scale = inputs((2, 7, 32), torch.float32)
    layer = LayerNorm(32)
    torch.nn.init.normal_(layer.weight)
    torch.nn.init.normal_(layer.bias)
    with torch.no_grad():
        by_hand = F.layer_norm(x, (32,), layer.weight, layer.bias, layer.eps) * (1 + scale) + shift
        assert torch.equal(layer(x, shift, scale), by_hand)
        assert torch.equal(layer(x), F.layer_norm(x, (32,), layer.weight, layer.bias, layer.eps))
        rms = RMSNorm(32)
        assert torch.equal(rms(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + rms.eps) * rms.weight)


@pytest.mark.parametrize("rows,width,expected", [
    (1, 1, ((1,), 1, 1, 4)),
    (16384, 256, ((1024,), 16, 256, 8)),  # a bundled-model trunk at batch 64: 1024 programs
    (5, 300, ((1,), 8, 512, 8)),
    (3, 4096, ((3,), 1, 4096, 8)),
    (2, MAX_KERNEL_WIDTH, ((2,), 1, MAX_KERNEL_WIDTH, 16)),
])
def test_launch_covers_every_row(rows, width, expected):
    grid, block_rows, block_w, _ = launch = norm_launch(rows, width)
    assert launch == expected
    assert grid[0] * block_rows >= rows and block_w >= width


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(x=torch.zeros(2, 3, dtype=torch.int64)), TypeError, "x must have dtype"),
    (dict(x=torch.zeros(())), ValueError, "at least one dimension"),
    (dict(x=torch.zeros(2, 0)), ValueError, r"x's last dimension must be in \[1, 1073741824\), got 0"),
    (dict(x=torch.zeros(2, 3), weight=torch.zeros(4)), ValueError, r"weight must have shape \[3\]"),
    (dict(x=torch.zeros(2, 3), weight=torch.zeros(2)), ValueError, r"weight must have shape \[3\]"),
    (dict(x=torch.zeros(2, 3), bias=torch.zeros(3, 1)), ValueError, "bias must be 1-D"),
    (dict(x=torch.zeros(2, 3), eps=-1.0), ValueError, "eps must be in"),
    (dict(x=torch.ones(2, 3), eps=0.0), ValueError, r"eps must be in \(0.0, inf\), got 0.0"),  # NaN rows
    (dict(x=torch.zeros(2, 3), eps=float("inf")), ValueError, "eps must be in"),
    (dict(x=torch.zeros(2, 3), rms=1), TypeError, "rms must be a bool"),
    (dict(x=torch.zeros(2, 4, 3), shift=torch.zeros(2, 3)), ValueError, "give both or neither"),
    (dict(x=torch.zeros(3), shift=torch.zeros(1, 3), scale=torch.zeros(1, 3)), ValueError, r"\[B, \.\.\., H\]"),
    (dict(x=torch.zeros(2, 4, 3), shift=torch.zeros(2, 4, 3), scale=torch.zeros(2, 4, 3)), ValueError,
     r"shift must have shape \[2, 3\] or \[2, 1, 3\]"),
    (dict(x=torch.zeros(2, 4, 3), shift=torch.zeros(2, 3), scale=torch.zeros(1, 3)), ValueError,
     "scale must have shape"),
    (dict(x=torch.zeros(2, 4, 3), shift=torch.zeros(2, 3), scale=torch.zeros(2, 3, dtype=torch.bfloat16)),
     TypeError, "share a dtype"),
    (dict(x=torch.zeros(2, 4, 3), shift=torch.zeros(2, 3, dtype=torch.int64),
          scale=torch.zeros(2, 3, dtype=torch.int64)), TypeError, "shift must have dtype"),
])
def test_bad_arguments_raise_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        norm(**kwargs)


@pytest.mark.parametrize("like, other", MISMATCHES)
@pytest.mark.parametrize("name", ["weight", "bias", "shift", "scale"])
def test_parameters_on_another_device_than_x_are_refused(name, like, other):
    """weight, bias, shift or scale on another device than x: the op's own ValueError, naming
    the argument and both devices (fake tensors stand in for a GPU)."""
    with fake_tensors(like):
        given = dict(weight=torch.ones(3), bias=torch.zeros(3), shift=torch.zeros(2, 3), scale=torch.zeros(2, 3))
        given[name] = moved(given[name], other)
        with pytest.raises(ValueError, match=rf"^{name} must be on the device of x \({like}\), got {other}$"):
            norm(torch.randn(2, 4, 3), **given)


def test_gradients_flow_through_the_reference():
    x, weight, bias, shift, scale = inputs((2, 5, 16), torch.float32)
    for t in (x, weight, shift):
        t.requires_grad_(True)
    norm(x, weight, bias, shift=shift, scale=scale).square().sum().backward()
    want = torch.autograd.grad(norm_reference(x, weight, bias, shift=shift, scale=scale).square().sum(),
                               (x, weight, shift))
    assert all(torch.equal(got, w) for got, w in zip((x.grad, weight.grad, shift.grad), want))


def test_an_empty_batch():
    x = torch.zeros(0, 4, 8)
    assert norm_triton(x, None, None, 1e-5, shift=torch.zeros(0, 8), scale=torch.zeros(0, 8)).shape == (0, 4, 8)
    assert norm(x).shape == (0, 4, 8)


def test_outputs_are_contiguous_as_the_fake_kernel_says():
    """x with contiguous channels but permuted rows: every path returns a contiguous tensor
    (the fake kernel's strides, which torch.compile's inductor relies on)."""
    x = torch.randn(6, 2, 8).transpose(0, 1)
    for rms in (False, True):
        torch.library.opcheck(torch.ops.ddpd.norm.default, (x, None, None, None, None, 1e-5, rms))
        assert norm(x, rms=rms).is_contiguous() and norm_triton(x, None, None, 1e-5, rms=rms).is_contiguous()


def test_vmap_runs_the_reference():
    """A kernel cannot read vmap's batched tensors: the op runs its reference under torch.func
    transforms (on CUDA too), slice by slice the same values."""
    from ddpd.validation import transformed

    x, weight, bias, _, _ = inputs((3, 2, 4, 8), torch.float32)
    seen = []
    torch.func.vmap(lambda t: seen.append(transformed(t)) or t)(x)
    assert seen == [True] and not transformed(x, None)
    batched = torch.func.vmap(lambda t: norm(t, weight, bias))(x)
    assert torch.equal(batched, torch.stack([norm_reference(t, weight, bias) for t in x]))


def test_opcheck_and_compile():
    x, weight, bias, shift, scale = inputs((2, 6, 8), torch.float32)
    torch.library.opcheck(torch.ops.ddpd.norm.default, (x, weight, bias, shift.contiguous(), scale.contiguous(),
                                                         1e-5, False))
    compiled = torch.compile(lambda *a: norm(*a, shift=shift, scale=scale), fullgraph=True, backend="eager")
    assert torch.equal(compiled(x, weight, bias), norm_reference(x, weight, bias, shift=shift, scale=scale))


def test_rows_and_modulation_with_strided_channels_are_read_by_their_strides():
    """x, shift and scale whose channels are not adjacent in memory (every other column of a
    wider tensor): the kernel reads them as the reference does, not as packed channels."""
    x = torch.randn(2, 3, 16)[..., ::2]
    mods = torch.randn(2, 32)
    shift, scale = mods[:, ::4], mods[:, 1::4]
    assert x.stride(-1) != 1 and shift.stride(-1) != 1 and scale.stride(-1) != 1
    weight, bias = torch.randn(8), torch.randn(8)
    for rms in (False, True):
        got = norm_triton(x, weight, bias, 1e-5, rms=rms, shift=shift, scale=scale)
        want = norm_reference(x, weight, bias, 1e-5, rms=rms, shift=shift, scale=scale)
        assert torch.allclose(got, want, atol=1e-5)


def test_the_op_passes_rms_and_eps_through():
    """norm(rms=True) is the RMS norm, not the layer norm, and eps reaches the arithmetic:
    rows with a mean far from 0 tell the two norms apart."""
    x, weight, bias, shift, scale = inputs((2, 3, 16), torch.float32)
    for rms in (False, True):
        for eps in (1e-5, 10.0):
            want = norm_reference(x, weight, bias, eps, rms=rms, shift=shift, scale=scale)
            assert torch.equal(norm(x, weight, bias, eps, rms=rms, shift=shift, scale=scale), want)
    assert not torch.allclose(norm(x, rms=True), norm(x, rms=False), atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_traced_call_on_a_gpu_returns_a_tensor_like_x(dtype):
    """Under fake tensors (a trace, on cuda:0 where the machine has none) the call goes
    through the registered op, whose fake kernel gives x's shape, dtype and device, contiguous
    as the kernel's output is, whatever the dtype of the float32 parameters."""
    with fake_tensors("cuda:0"):
        x = torch.empty(4, 2, 8, dtype=dtype).transpose(0, 1)
        out = norm(x, torch.ones(8), torch.zeros(8), shift=torch.zeros(2, 8), scale=torch.zeros(2, 8))
        assert (out.shape, out.dtype, str(out.device)) == ((2, 4, 8), dtype, "cuda:0") and out.is_contiguous()


def test_a_compiled_call_takes_gradients_and_an_integer_eps():
    """A call torch.compile traces that needs a gradient runs the differentiable reference,
    not the custom op (which has no backward); one that needs none reaches the op with eps
    as the float its schema takes, also when given as an int."""
    x, weight, bias, shift, scale = inputs((2, 5, 16), torch.float32)
    compiled = torch.compile(norm, fullgraph=True, backend="eager")
    for eps in (1, 1e-5):
        assert torch.equal(compiled(x, weight, bias, eps, shift=shift, scale=scale),
                           norm_reference(x, weight, bias, eps, shift=shift, scale=scale))
    x.requires_grad_(True)
    compiled(x, weight, bias, shift=shift, scale=scale).square().sum().backward()
    want = torch.autograd.grad(norm_reference(x, weight, bias, shift=shift, scale=scale).square().sum(), x)[0]
    assert torch.equal(x.grad, want)


@pytest.mark.parametrize("rms", [False, True])
def test_the_kernel_adds_eps_to_the_variance_of_every_norm(rms):
    """A large eps against rows of small spread: the kernel's layer and RMS norms both add it
    under the square root, as the reference does (a dropped eps would be invisible at 1e-5)."""
    x, weight, bias, shift, scale = inputs((2, 3, 24), torch.float32)
    x = x * 1e-2
    bias = None if rms else bias
    for eps in (0.5, 10.0):
        got = norm_triton(x, weight, bias, eps, rms=rms, shift=shift, scale=scale)
        want = norm_reference(x, weight, bias, eps, rms=rms, shift=shift, scale=scale)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("x_dtype,modulation_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16),
                                                      (torch.float32, torch.bfloat16)])
def test_a_modulation_in_another_dtype_than_x_is_read_in_its_own(x_dtype, modulation_dtype):
    """shift and scale need not share x's dtype: the kernel widens them by their own dtype,
    not x's, and agrees with the reference."""
    x, weight, bias, shift, scale = inputs((2, 5, 40), x_dtype)
    shift, scale = shift.to(modulation_dtype), scale.to(modulation_dtype)
    for rms in (False, True):
        got = norm_triton(x, weight, bias, 1e-5, rms=rms, shift=shift, scale=scale)
        want = norm_reference(x, weight, bias, 1e-5, rms=rms, shift=shift, scale=scale)
        assert got.dtype == x_dtype
        assert_rounded_from(got, want.double(), x_dtype, 1 if x_dtype != torch.float32 else 64)


def test_shift_and_scale_rows_are_read_by_their_own_strides():
    """shift and scale from different tensors, whose rows lie at different strides: each is
    read by its own, not the other's."""
    x, weight, bias, _, _ = inputs((3, 4, 24), torch.float32)
    shift = torch.randn(3, 72)[:, 8:32]
    scale = torch.randn(3, 24)
    assert shift.stride(0) != scale.stride(0)
    for rms in (False, True):
        got = norm_triton(x, weight, bias, 1e-5, rms=rms, shift=shift, scale=scale)
        want = norm_reference(x, weight, bias, 1e-5, rms=rms, shift=shift, scale=scale)
        assert torch.allclose(got, want, atol=1e-5)


def test_constant_rows_of_a_strided_view_each_normalise_to_the_bias():
    """Rows of different constants in a view whose rows are not packed: each row's own values
    centre it (exactly, whatever its float32 sum rounds to), so each gives the bias."""
    base = torch.zeros(3, 12)
    base[:, 2:5] = torch.tensor([12345.678, -12345.678, 12345.678])[:, None]
    x = base[:, 2:5]
    bias = torch.randn(3)
    assert torch.equal(norm_triton(x, None, bias, 1e-5), bias.expand(3, 3))


def test_a_single_channel_whose_square_nears_the_float32_maximum_still_normalises():
    """NaN is for squares that overflow float32: a one-channel RMS row whose square is just
    below the maximum normalises to its sign, as in the reference."""
    x = torch.tensor([[1.8e19], [-1.8e19], [3.0]])
    assert (x * x).isfinite().all() and (x[:1] * x[:1] > 3e38).all()
    got = norm_triton(x, None, None, 1e-5, rms=True)
    assert torch.allclose(got, norm_reference(x, None, None, 1e-5, rms=True))
    assert torch.allclose(got, torch.tensor([[1.0], [-1.0], [1.0]]))


def test_bfloat16_subnormal_rows_and_shifts_are_widened_from_their_bits():
    """Subnormal bfloat16 values (which the interpreter's own conversion would change): an
    RMS row of them scales by 1 / sqrt(eps) as in the reference, and with a zero weight the
    output is the subnormal shift itself."""
    tiny = torch.finfo(torch.bfloat16).tiny
    sub = torch.tensor([tiny / 4, tiny * 0.75, tiny / 64, -tiny / 2, tiny / 8, -tiny * 0.25])
    x = sub.repeat(2, 3, 1).to(torch.bfloat16)
    got = norm_triton(x, None, None, 1e-5, rms=True)
    want = norm_reference(x, None, None, 1e-5, rms=True)
    assert (want != 0).all() and torch.allclose(got.float(), want.float(), rtol=1e-2, atol=0.0)
    shift = sub.flip(0).repeat(2, 1).to(torch.bfloat16)
    got = norm_triton(x, torch.zeros(6), None, 1e-5, shift=shift, scale=torch.ones_like(shift))
    assert torch.equal(got.view(torch.int16), shift[:, None].expand(2, 3, 6).view(torch.int16))


def test_strided_weight_and_bias_are_read_by_value():
    """weight and bias as views whose channels are not adjacent in memory (every other entry
    of a wider tensor): the kernel scales and shifts by their values, not the packed memory."""
    x = torch.randn(3, 2, 8, generator=torch.Generator().manual_seed(11))
    params = torch.randn(2, 16, generator=torch.Generator().manual_seed(12))
    weight, bias = params[0, ::2], params[1, 1::2]
    assert weight.stride(-1) != 1 and bias.stride(-1) != 1
    for rms in (False, True):
        got = norm_triton(x, weight, bias, 1e-5, rms=rms)
        want = norm_reference(x, weight.contiguous(), bias.contiguous(), 1e-5, rms=rms)
        assert torch.allclose(got, want, atol=1e-5)
