"""GPTQ's core on single matrices: identity Hessian is RTN, correlated inputs make it better."""
import pytest
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


def _pushing_hessian(a: float) -> torch.Tensor:
    """The Hessian whose inverse has upper Cholesky factor U = I + a·E[0,2]: column 0's error, and
    only it, moves column 2 (by -a·error), with no damping; H = U⁻¹U⁻ᵀ = I - a(E02 + E20) + a²E00."""
    h = torch.eye(4)
    h[0, 2] = h[2, 0] = -a
    h[0, 0] = 1 + a * a
    return h


def test_grid_rules_by_hand_on_a_case_built_so_they_must_differ():
    """int2 asymmetric, groups (and lazy blocks) of 2, one row [0.5, 0.9 | 1.1, -0.4]; column 0's
    error -0.1 moves column 2 to 1.15 (to float32 rounding of the Cholesky steps, hence the 1e-6 tolerance). Group A: scale 0.9/3, zero 0: 0.5 -> code 2, 0.9 -> 3. Group B from the
    original weights (llm-compressor): scale 1.5/3, zero round(0.4/0.5) = 1, 1.15 -> round(2.3)+1 = 3
    -> (3-1)·0.5 = 1.0, -0.4 -> round(-0.8)+1 = 0 -> -0.5. From the updated weights (IST-DASLab):
    scale 1.55/3, zero round(0.774) = 1, the same codes on the wider grid: 2·s, -1·s."""
    spec = WeightSpec.parse("gptq-int2-g2")
    w = torch.tensor([[0.5, 0.9, 1.1, -0.4]])
    f = torch.float32
    s_a = torch.tensor(0.9, dtype=f) / 3
    moved = torch.tensor(1.1, dtype=f) - ((torch.tensor(0.5, dtype=f) - 2 * s_a) / 1) * torch.tensor(0.5, dtype=f)
    s_original = (torch.tensor(1.1, dtype=f) - torch.tensor(-0.4, dtype=f)) / 3
    s_updated = (moved - torch.tensor(-0.4, dtype=f)) / 3
    qparams, fake = affine_quantizer(spec)
    got = {grid: gptq_quantize(w, _pushing_hessian(0.5), qparams, fake, group_size=2, damp=0.0, block_size=2,
                                 grid=grid)
           for grid in ("original", "updated")}
    close = dict(rtol=1e-6, atol=0.0)
    torch.testing.assert_close(got["original"], torch.stack([2 * s_a, 3 * s_a, 2 * s_original, -1 * s_original])[None], **close)
    torch.testing.assert_close(got["updated"], torch.stack([2 * s_a, 3 * s_a, 2 * s_updated, -1 * s_updated])[None], **close)
    assert float(s_original) == pytest.approx(0.5) and float(s_updated) == pytest.approx(1.55 / 3)


def test_original_grid_is_the_rtn_grid_of_the_weights_as_given():
    """Every group's (scale, zero) is the round-to-nearest grid of the unquantized weights — dead
    input columns included (llm-compressor's observer runs before GPTQ zeroes them) — and with
    act-order the groups stay those of the original columns (g_idx = arange // G, no g_idx needed)."""
    from wkvlab.formats import affine_qparams

    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(24, 192, generator=g), _correlated_inputs(256, 192)
    x[:, 7] = 0  # a dead input
    h, _ = accumulate_hessian(torch.zeros(192, 192), 0, x)
    spec = WeightSpec.parse("gptq-int4-g64+grid-from=original")
    qparams, fake = affine_quantizer(spec)
    scale, zero = affine_qparams(w, 4, group_size=64, symmetric=False)
    for act_order in (False, True):
        record = {}
        q = gptq_quantize(w, h, qparams, fake, group_size=64, act_order=act_order, grid="original", record=record)
        assert torch.equal(record["g_idx"], torch.arange(192) // 64)
        for k, (s, z) in enumerate(record["params"]):
            assert torch.equal(s[:, 0], scale[:, k, 0]) and torch.equal(z[:, 0], zero[:, k, 0])
        codes = torch.round(q.reshape(24, 3, 64) / scale)  # every value on its group's original grid
        assert ((codes + zero >= 0) & (codes + zero <= 15)).all() and torch.equal(q.reshape(24, 3, 64), codes * scale)
    updated = gptq_quantize(w, h, qparams, fake, group_size=64)
    assert (updated != q).float().mean() > 0.2  # the two rules are different GPTQs, not a rounding detail


def test_per_row_grid_sees_dead_inputs_as_ist_daslab_does():
    """Per row (no groups) both rules find the grid before the column loop, on the weight as given:
    IST-DASLab's find_params(W) runs before its dead-column line, so a dead input's large weight
    still sets its row's scale (then GPTQ zeroes it)."""
    g = torch.Generator().manual_seed(5)
    w, x = torch.randn(6, 64, generator=g), torch.randn(128, 64, generator=g)
    w[:, 3], x[:, 3] = 50.0, 0.0  # the row maxima sit on a dead input
    h, _ = accumulate_hessian(torch.zeros(64, 64), 0, x)
    spec = WeightSpec.parse("gptq-int4")
    for grid in ("updated", "original"):
        record = {}
        q = gptq_quantize(w, h, *affine_quantizer(spec), grid=grid, record=record)
        scale = record["params"][0][0][:, 0]
        assert torch.equal(scale, (50.0 - w.amin(dim=1).clamp(max=0)) / 15)
        assert torch.equal(q[:, 3], torch.zeros(6))


def _llmcompressor_like(w: torch.Tensor, h: torch.Tensor, group: int) -> torch.Tensor:
    """A minimal transcription of llmcompressor 0.14.0.1 GPTQ for asymmetric INT4 groups, a SECONDARY
    check (the slow tier runs llm-compressor itself, tests/weights/test_gptq_llmcompressor.py):
    compressed-tensors 0.19 calculate_qparams on the original weight per group (range widened to
    contain 0, scale (max-min)/15, zero point clamp(-8 - min/scale, -8, 7) rounded), then
    quantize_weight's loop with fake_quantize = clamp(x/scale + zp, -8, 7) rounded, (q - zp)·scale."""
    w, h = w.clone(), h.clone()
    rows, cols = w.shape
    g = w.reshape(rows, cols // group, group)
    lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
    scale = (hi - lo) / 15
    zp = torch.round(torch.clamp(-8 - lo / scale, -8, 7))
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h += 0.01 * torch.mean(torch.diag(h)) * torch.eye(cols)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    for i1 in range(0, cols, 128):
        i2 = min(i1 + 128, cols)
        w1, err = w[:, i1:i2].clone(), torch.zeros(rows, i2 - i1)
        for i in range(i2 - i1):
            s, z = scale[:, (i1 + i) // group], zp[:, (i1 + i) // group]
            q = (torch.round(torch.clamp(w1[:, i] / s + z, -8, 7)) - z) * s
            e = (w1[:, i] - q) / hinv[i1 + i, i1 + i]
            w1[:, i:] -= e[:, None] * hinv[i1 + i, i1 + i:i2][None, :]
            err[:, i] = e
            w[:, i1 + i] = q
        w[:, i2:] -= err @ hinv[i1:i2, i2:]
    return w


def test_original_grid_matches_a_transcription_of_llmcompressor():
    g = torch.Generator().manual_seed(4)
    w, x = torch.randn(32, 256, generator=g), _correlated_inputs(512, 256, seed=4)
    h, _ = accumulate_hessian(torch.zeros(256, 256), 0, x)
    spec = WeightSpec.parse("gptq-int4-g64+grid-from=original")
    q = gptq_quantize(w, h, *affine_quantizer(spec), group_size=64, grid="original")
    assert torch.equal(q, _llmcompressor_like(w, h, 64))
