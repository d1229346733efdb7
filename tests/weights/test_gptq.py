"""GPTQ's core on single matrices: identity Hessian is RTN, correlated inputs make it better."""
import torch

from wkvlab.weights import WeightSpec, gptq_quantize, quantize_weight
from wkvlab.weights.capture import accumulate_hessian
from wkvlab.weights.gptq import affine_quantizer


def _correlated_inputs(n: int, dim: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(dim, dim, generator=g) / dim**0.5 + torch.eye(dim)
    scales = torch.exp(torch.randn(dim, generator=g))  # some channels much larger, as in LLMs
    return (torch.randn(n, dim, generator=g) @ mix) * scales


def _gptq(w, x, text, **kw):
    spec = WeightSpec.parse(text)
    h, _ = accumulate_hessian(torch.zeros(w.shape[1], w.shape[1]), 0, x)
    return gptq_quantize(w, h, *affine_quantizer(spec), group_size=spec.group_size, **kw)


def test_identity_hessian_without_damping_is_rtn():
    torch.manual_seed(0)
    w = torch.randn(16, 256)
    spec = WeightSpec.parse("int4-g128")
    q = gptq_quantize(w, torch.eye(256), *affine_quantizer(spec), group_size=128, damp=0.0)
    assert torch.equal(q, quantize_weight(w, spec))


def test_gptq_beats_rtn_output_error_on_a_random_linear():
    torch.manual_seed(1)
    for text, cols in (("int4-g128", 576), ("int4", 256), ("int3-g64-sym", 256)):
        w = torch.randn(64, cols)
        x = _correlated_inputs(2048, cols)
        rtn = quantize_weight(w, WeightSpec.parse(text))
        for act_order in (False, True):
            q = _gptq(w, x, text, act_order=act_order)
            err_gptq = ((x @ (q - w).T) ** 2).mean()
            err_rtn = ((x @ (rtn - w).T) ** 2).mean()
            assert err_gptq < 0.8 * err_rtn, (text, act_order, float(err_gptq), float(err_rtn))


def test_gptq_values_lie_on_the_group_grid():
    torch.manual_seed(2)
    w, x = torch.randn(8, 576), _correlated_inputs(512, 576)
    q = _gptq(w, x, "int4-g128")
    for lo in range(0, 576, 128):  # at most 16 distinct levels per row and group (ragged last group too)
        assert max(len(torch.unique(row)) for row in q[:, lo:lo + 128]) <= 16


def test_hessian_accumulates_as_a_running_mean():
    x = torch.randn(100, 8)
    h1, n1 = accumulate_hessian(torch.zeros(8, 8), 0, x[:40])
    h2, n2 = accumulate_hessian(h1, n1, x[40:])
    assert n2 == 100 and torch.allclose(h2, 2 * x.T @ x / 100, atol=1e-5)


def test_stacked_linears_with_one_hessian_quantize_as_separately_and_fake_matches_affine():
    """gptq_layers quantizes q/k/v (gate/up) stacked along the rows: bit-identical to one by one."""
    from wkvlab.formats import affine_dequantize, affine_quantize
    from wkvlab.weights import WeightSpec
    from wkvlab.weights.gptq import affine_quantizer, gptq_quantize

    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 200, generator=g)
    h = x.T @ x / 96
    for text in ("int4-g64-sym", "int4-g64", "int3-g32-fmin", "int4-g64;actorder"):
        spec = WeightSpec.parse(text)
        qparams, fake = affine_quantizer(spec)
        ws = [torch.randn(r, 200, generator=g) for r in (48, 16, 16)]
        kw = dict(group_size=spec.group_size, act_order=spec.act_order)
        separate = torch.cat([gptq_quantize(w, h, qparams, fake, **kw) for w in ws])
        assert torch.equal(gptq_quantize(torch.cat(ws), h, qparams, fake, **kw), separate), text
        column = torch.randn(64, generator=g) * 3
        s, z = qparams(torch.randn(64, 10, generator=g))
        args = dict(symmetric=spec.symmetric, zero_point=spec.zero_point)
        ref = affine_dequantize(affine_quantize(column[:, None], s[:, :, None], z[:, :, None], spec.bits, **args),
                                s[:, :, None], z[:, :, None], **args)[:, 0]
        assert torch.equal(fake(column, s, z), ref), text
