"""Presets named after engines compute what those engines' kernels compute (hand-computed values)."""
import math

import pytest
import torch

from wkvlab.errors import ConfigError
from tests.conftest import tiny_llama
from wkvlab.formats.exl3 import fake_quant_exl3
from wkvlab.formats.vllm_int4 import fake_quant_vllm_int4, rht_signs
from wkvlab.kv import KVSpec, get_kv_format
from wkvlab.kv.hook import layer_stores
from wkvlab.kv.presets import ENGINE_CHECKED_LLAMACPP, FIDELITY, describe_preset, fidelity_of, preset_names
from wkvlab.kv.store import LayerStore


# ---- ExLlamaV3 (exllamav3_ext/cache/q_cache_kernels.cuh) -------------------------------------

@pytest.mark.parametrize("grid, fmt, top", [("midpoint", "exl3_{}", lambda m: (m - 0.5) / m), ("nearest", "exl3rn_{}", lambda m: (m - 1) / m)])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_exl3_unit_vector_hand_computed(bits, grid, fmt, top):
    # H32·e0/√32 is 1/√32 everywhere: every value sits at the group's absmax, s = 1/√32 + 1e-10.
    # midpoint (v1.0.0 on): q = 2^b − 1 (clamped from floor(2m)), level (m − 0.5)/m;
    # nearest (v0.0.28 quant_block: v /= s, lrintf(v·m) = m, q = 2m clamped to 2m − 1), level (q − m)/m = (m − 1)/m.
    # Rotated back the group is e0 · √32 · fp16(s) · level
    x = torch.zeros(1, 32)
    x[0, 0] = 1.0
    m = 2 ** (bits - 1)
    s16 = float(torch.tensor(1 / math.sqrt(32) + 1e-10).to(torch.float16))
    want = torch.zeros(1, 32)
    want[0, 0] = math.sqrt(32) * s16 * top(m)
    torch.testing.assert_close(fake_quant_exl3(x, bits, grid), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(get_kv_format(fmt.format(bits)).quantize(x), want, rtol=1e-6, atol=1e-6)


def test_exl3_constant_group_hand_computed():
    # all ones: H32 gives (√32, 0, ..., 0); at 2 bits q = (3, 2, ..., 2) → levels (0.75, 0.25, ..., 0.25)·s16;
    # rotated back: x̂0 = (0.75 + 31·0.25)·s16/√32 = 8.5·s16/√32, x̂j = (0.75 − 0.25)·s16/√32
    x = torch.ones(1, 64)
    s16 = float(torch.tensor(math.sqrt(32) + 1e-10).to(torch.float16))
    out = fake_quant_exl3(x, 2)[0]
    for g in (0, 32):
        assert out[g].item() == pytest.approx(8.5 * s16 / math.sqrt(32), rel=1e-6)
        torch.testing.assert_close(out[g + 1 : g + 32], torch.full((31,), 0.5 * s16 / math.sqrt(32)), rtol=1e-6, atol=1e-6)


def test_exl3_nearest_grid_of_0_0_x_hand_computed_in_the_rotated_domain():
    # choose the rotated group y directly (x = H32·y/√32, H32 its own inverse): max|y| = 1 = s (1 + 1e-10 is 1 in
    # float32, exact in fp16). 2 bits, m = 2: y·2 = 2, 0.4, 0.6, -0.6, 1.4, -1.6, 0.2, -0.2 -> lrintf 2, 0, 1, -1, 1, -2, 0, 0
    # -> q = rint + 2 clamped to [0, 3]: 3, 2, 3, 1, 3, 0, 2, 2 -> (q - 2)/2: 0.5, 0, 0.5, -0.5, 0.5, -1, 0, 0.
    # The midpoint grid (v1.0.0 on): floor(y·2 + 2) = 3 (clamped from 4), 2, 2, 1, 3, 0, 2, 1 -> (q - 1.5)/2.
    from wkvlab.formats.hadamard import rotate

    y = torch.tensor([[1.0, 0.2, 0.3, -0.3, 0.7, -0.8, 0.1, -0.1] + [0.05] * 24])
    x = rotate(y, 32, inverse=True)
    nearest = rotate(fake_quant_exl3(x, 2, grid="nearest"), 32)[0, :8]
    midpoint = rotate(fake_quant_exl3(x, 2), 32)[0, :8]
    torch.testing.assert_close(nearest, torch.tensor([0.5, 0, 0.5, -0.5, 0.5, -1, 0, 0]), rtol=0, atol=1e-6)
    torch.testing.assert_close(midpoint, torch.tensor([0.75, 0.25, 0.25, -0.25, 0.75, -0.75, 0.25, -0.25]), rtol=0, atol=1e-6)
    with pytest.raises(ConfigError, match="midpoint, nearest"):
        fake_quant_exl3(x, 2, grid="floor")


def test_exl3_preset_uses_the_kernel_format_and_its_bytes():
    spec = KVSpec.parse("exl3:k4v2")
    assert (spec.k, spec.v, spec.rotate) == ("exl3_4", "exl3_2", 0)  # the H32 rotation is inside the format
    assert spec.bytes_per_token(layers=1, kv_heads=1, head_dim=128) == (128 * 4 / 8 + 8) + (128 * 2 / 8 + 8)
    # a midpoint 2-bit grid has 4 levels and no zero: never exactly zero, unlike a symmetric int2 group
    torch.manual_seed(0)
    x = torch.randn(64, 128)
    rel = lambda fmt: ((get_kv_format(fmt).quantize(x) - x).pow(2).mean() / x.pow(2).mean()).item()  # noqa: E731
    assert rel("exl3_2") < rel("int2-g32-sym") / 2  # the old preset's grid was ~3x worse at 2 bits
    assert rel("exl3_8") < 1e-4


# ---- vLLM int4_per_token_head (vllm/v1/attention/ops/int4_per_token_head.py) ----------------

def test_vllm_int4_hand_computed():
    d = 16
    signs, h = rht_signs(d), torch.tensor([[(-1) ** bin(i & j).count("1") for j in range(d)] for i in range(d)], dtype=torch.float32)
    # choose the rotated vector y = H·(D·x) directly: x = D·H·y / d
    y = torch.tensor([-1.0, 0.3, 2.0, 0.0] + [0.5] * 12)
    x = (signs * (h @ y)) / d
    # scale = (2 − (−1))/15 = 0.2, stored with its low 4 mantissa bits replaced by the zero point;
    # zp = round(1/0.2) = 5; 0.3/0.2 + 5 = 6.5 → 7 (half away from zero), 0.5 → 7.5 → 8
    scale = torch.tensor(3.0 / 15.0)
    trunc = (scale.view(torch.int32) & -16).view(torch.float32)
    codes = torch.tensor([0.0, 7.0, 15.0, 5.0] + [8.0] * 12)
    y_hat = (codes - 5) * trunc
    want = signs * (h @ y_hat) / d
    torch.testing.assert_close(fake_quant_vllm_int4(x[None])[0], want, rtol=1e-5, atol=1e-6)
    assert set(signs.tolist()) == {-1.0, 1.0}
    assert KVSpec.parse("vllm:int4_per_token_head").bytes_per_token(layers=1, kv_heads=1, head_dim=64) == 2 * (32 + 4)


def test_vllm_int4_rounds_the_rotated_head_to_a_16bit_input_dtype():
    # vLLM: y = single_rht(key.float()).to(key.dtype) before the INT4 kernel (which computes in float32):
    # integer heads x = D ⊙ v give exact integer y = H·v, and 9-bit integers are not bf16 (spacing 2 above 256)
    d = 16
    signs = rht_signs(d)
    h = torch.tensor([[(-1) ** bin(i & j).count("1") for j in range(d)] for i in range(d)], dtype=torch.float32)
    v = torch.tensor([[200.0, 57.0, 3.0, 1.0] + [0.0] * 12, [300.0, -41.0, 9.0, 0.0, 5.0] + [0.0] * 11])
    x = (signs * v).to(torch.bfloat16)
    y32 = (x.float() * signs) @ h  # exact integers
    y16 = y32.to(torch.bfloat16).float()
    assert not torch.equal(y16, y32)

    def kernel(y):  # _reshape_cache_int4_kernel, then the read's (q - zp) * truncated scale, rotated back
        lo, hi = torch.aminmax(y, dim=-1, keepdim=True)
        scale = torch.clamp((hi - lo) / 15.0, min=1e-6)
        zp = torch.where(-lo / scale >= 0, torch.trunc(-lo / scale + 0.5), torch.trunc(-lo / scale - 0.5)).clamp(0, 15)
        t = y * (1.0 / scale) + zp
        q = torch.where(t >= 0, torch.trunc(t + 0.5), torch.trunc(t - 0.5)).clamp(0, 15)
        return (((q - zp) * (scale.view(torch.int32) & -16).view(torch.float32)) @ h) * signs / d

    got = fake_quant_vllm_int4(x)
    assert torch.equal(got, kernel(y16).to(torch.bfloat16))
    assert not torch.equal(got, kernel(y32).to(torch.bfloat16))  # float32 rotated values store other codes
    assert torch.equal(fake_quant_vllm_int4(x.float()), kernel(y32))  # a float32 run keeps float32 rotated values


def test_kivi_and_quanto_labels_state_their_16bit_arithmetic():
    kivi = describe_preset("kivi2")
    assert kivi.fidelity == "source-faithful" and "fp16" in kivi.differs and "0.06-0.3% of codes" in kivi.differs
    quanto = describe_preset("hf-quanto:int4")  # quanto's 16-bit arithmetic is modelled (quanto<b>): nothing to state
    assert quanto.fidelity == "source-faithful" and not quanto.differs and quanto.spec.k == "quanto4"


def test_vllm_int4_is_not_plain_int4():
    torch.manual_seed(1)
    x = torch.randn(8, 64)
    x[:, 5] *= 20  # an outlier channel: the rotation spreads it
    plain = get_kv_format("int4").quantize(x)
    vllm = get_kv_format("int4_pth").quantize(x)
    assert (vllm - x).pow(2).mean() < (plain - x).pow(2).mean() / 2


# ---- llama.cpp rotation blocks per side (src/llama-kv-cache.cpp build_input_k_rot/v_rot) -----

@pytest.mark.parametrize("head_dim,k_block", [(64, 64), (128, 128), (256, 256)])
def test_llamacpp_rotates_k_in_the_largest_power_of_two_and_v_in_64(head_dim, k_block):
    model = tiny_llama(head_dim=head_dim, num_attention_heads=2, num_key_value_heads=1, hidden_size=128)
    store = layer_stores(model, KVSpec.parse("llamacpp:q4_0"))[0]
    assert (store.rot_k, store.rot_v) == (k_block, 64)
    # e_5 through llama.cpp's rotation (ggml_gen_hadamard in src/llama-kv-cache.cpp: the orthonormal
    # Sylvester matrix, H[i][j] = (-1)^popcount(i & j) / sqrt(n)) is row 5 of H: +-c with c = 1/sqrt(block),
    # sign s_i = (-1)^popcount(5 & i), the same pattern in every block of 32 and + at each block's start.
    e5 = torch.zeros(head_dim)
    e5[5] = 1.0
    q, k, v = e5.expand(1, 2, 1, head_dim).clone(), e5.expand(1, 1, 1, head_dim).clone(), e5.expand(1, 1, 1, head_dim).clone()
    _q2, _k2, kq, _v2, vq = store.apply(q, k, v)
    sign = torch.tensor([(-1.0) ** bin(5 & i).count("1") for i in range(head_dim)])
    fp16 = lambda t: float(torch.tensor(t).to(torch.float16))  # noqa: E731

    def q4_0_of_pm(c: float, signs: torch.Tensor) -> torch.Tensor:
        # q4_0 (ggml-quants.c): d = max/-8 with max = the block's first largest |x| = +c -> d = fp16(-c/8);
        # +c -> trunc(-8 + 8.5) = 0 -> value d * -8; -c -> MIN(15, trunc(8 + 8.5)) = 15 -> value d * 7
        d16 = fp16(-c / 8)
        return torch.where(signs > 0, torch.tensor(-8.0 * d16), torch.tensor(7.0 * d16))

    c_k = 1 / math.sqrt(k_block)
    torch.testing.assert_close(kq[0, 0, 0], q4_0_of_pm(c_k, sign), rtol=0, atol=0)
    # V: blocks of 64; e_5 lives in the first block (c = 1/8, fp16(1/64) exact), the others stay 0 (d = 0)
    want_v = torch.zeros(head_dim)
    want_v[:64] = q4_0_of_pm(1 / 8, sign[:64])
    torch.testing.assert_close(vq[0, 0, 0], want_v, rtol=0, atol=0)
    # Q rotated like K, then q8_0 (vec_dot_type of q4_0): d = fp16(c/127), codes roundf(+-c * 127/c) = +-127
    torch.testing.assert_close(_q2[0, 0, 0], sign * 127 * fp16(c_k / 127), rtol=0, atol=0)


def test_gemma3_head_dim_256_rotation_blocks():
    assert KVSpec.parse("llamacpp:q8_0/q4_0").rotation_blocks(256) == (256, 64)
    assert KVSpec.parse("llamacpp:q8_0+norot").rotation_blocks(256) == (0, 0)


# ---- FP8 scale conventions and vLLM's FP8 query -----------------------------------------------

def _stats(model):
    from wkvlab.kv.calibrate import collect_kv_stats

    return collect_kv_stats(model, torch.randint(0, 128, (2, 16)))


def test_scale_conventions_amax448_and_vllm_calculate():
    model = tiny_llama()
    stats = _stats(model)
    k_amax, v_amax, q_amax = stats.k_absmax[0].amax(), stats.v_absmax[0].amax(), stats.q_absmax[0].amax()
    x = torch.full((1, 1, 1, 32), float(k_amax))
    for text, k_scale in (("fp8_e4m3+scales=amax448", k_amax / 448), ("fp8_e4m3+scales=calculate", k_amax / 200)):
        spec = KVSpec.parse(text)
        store = LayerStore(spec, 0, *spec.formats_for(0), 32, stats)
        # the layer's largest key lands exactly on scale * (amax / scale): 448 or 200 in FP8
        torch.testing.assert_close(store.k_quant(x), x, rtol=0.07, atol=0)  # representable within e4m3's step
        # 3 · scale is 3 in FP8, exactly representable: comes back exactly (a wrong scale would not)
        assert store.k_quant(torch.full((1, 1, 1, 32), float(k_scale) * 3))[0, 0, 0, 0].item() == pytest.approx(float(k_scale) * 3, rel=1e-6)
        assert store.k_quant(torch.full((1, 1, 1, 32), float(k_scale) * 3.1))[0, 0, 0, 0].item() != pytest.approx(float(k_scale) * 3.1, rel=1e-6)
    calc = KVSpec.parse("vllm-fa3@0.27:fp8_e4m3+scales=calculate")  # --calculate-kv-scales: vLLM 0.27.1 and older
    store = LayerStore(calc, 0, *calc.formats_for(0), 32, stats)
    assert float(store.q_scale) == pytest.approx(float(q_amax / 200))
    assert float(LayerStore(calc, 0, *calc.formats_for(0), 32, stats).v_quant(torch.full((1, 1, 1, 32), float(v_amax / 100) * 5))[0, 0, 0, 0]) == pytest.approx(float(v_amax / 100) * 5, rel=1e-6)
    assert KVSpec.parse("fp8_e4m3+scales=tensor") == KVSpec.parse("fp8_e4m3+scales=amax448")  # the older name


@pytest.mark.parametrize("text", ["vllm:fp8_e4m3+scales=calculate", "vllm-fa3:fp8_e4m3+scales=calc", "vllm@0.34:fp8_e4m3+scales=calculate"])
def test_calculate_kv_scales_is_refused_where_vllm_has_none(text):
    # vLLM 0.28.0 to 0.34.0 have no calculate_kv_scales (vllm/config/cache.py, engine/arg_utils.py of the sdists)
    with pytest.raises(ConfigError, match=r"no --calculate-kv-scales \(vLLM 0.27.1 is the last release with it\).*@0.27:fp8_e4m3\+scales=calculate"):
        KVSpec.parse(text)
    assert KVSpec.parse("vllm@0.27:fp8_e4m3+scales=calculate").scales == "calculate"
    assert KVSpec.parse("vllm@0.23:fp8_e4m3+scales=calculate").scales == "calculate"
    assert KVSpec.parse("fp8_e4m3+scales=calculate").scales == "calculate"  # wkvlab's own format: no engine release


def test_vllm_fa3_quantizes_q_and_plain_vllm_fp8_does_not():
    assert KVSpec.parse("vllm-fa3:fp8_e4m3").q == "fp8_e4m3"
    assert KVSpec.parse("vllm:fp8_e4m3").q == "none"


# ---- SGLang FP8 KV (memory_pool.py set_kv_buffer: x.to(float8), torch's cast) ---------------------

def _sglang_fp8(name: str, values: list[float]) -> list[float]:
    return KVSpec.parse(name).k_format.quantize(torch.tensor([values]))[0].tolist()


def test_sglang_fp8_e4m3_is_torchs_saturating_nearest_even_cast():
    # torch 2.13 fp8e4m3fn_from_fp32_value, by hand: steps of 1/8 in [1, 2), 32 in [256, 448]; ties to the even code:
    # 1.0625 -> 1 (000), 1.1875 -> 1.25 (010), 304 -> 320 (288 is 001); 300 -> 288 (nearer); from 448 on every
    # finite value saturates (its overflow branch returns 0x7e); subnormals step 2^-9: 2^-10 ties to 0, 1.5 * 2^-9 to 2^-8
    x = [1.0625, 1.1875, 300.0, 304.0, 450.0, 470.0, 1e6, -500.0, 2.0 ** -10, 1.5 * 2.0 ** -9]
    assert _sglang_fp8("sglang:fp8_e4m3", x) == [1.0, 1.25, 288.0, 320.0, 448.0, 448.0, 448.0, -448.0, 0.0, 2.0 ** -8]
    assert math.isnan(_sglang_fp8("sglang:fp8_e4m3", [float("nan")])[0])


def test_sglang_fp8_e5m2_overflows_to_inf_where_a_saturating_cast_would_not():
    # torch 2.13 fp8e5m2_from_fp32_value, by hand: steps of 1/4 in [1, 2): 1.125 -> 1 (00), 1.375 -> 1.5 (10);
    # the largest finite value is 57344 (mantissa 11, odd), so the midpoint 61440 to the next code (65536, inf)
    # rounds to it: +-inf from +-61440 on, while 61439 and 60000 stay 57344
    x = [1.125, 1.375, 57344.0, 60000.0, 61439.0, 61440.0, -61440.0, 1e6]
    inf = float("inf")
    assert _sglang_fp8("sglang:fp8_e5m2", x) == [1.0, 1.5, 57344.0, 57344.0, 57344.0, inf, -inf, inf]
    assert math.isnan(_sglang_fp8("sglang:fp8_e5m2", [float("nan")])[0])
    # a saturating E5M2 (vLLM's preset, fake_quant_fp8) keeps 57344 there: the two rules really differ
    assert _sglang_fp8("vllm:fp8_e5m2", [61440.0, -1e6]) == [57344.0, -57344.0]
    assert get_kv_format("fp8_e5m2-nosat").bytes_per_vector(64) == 64


def test_sglang_fp8_presets_name_the_store_and_read_they_were_read_from():
    assert (KVSpec.parse("sglang:fp8_e4m3").k, KVSpec.parse("sglang:fp8_e5m2").v) == ("fp8_e4m3", "fp8_e5m2-nosat")
    for name in ("sglang:fp8_e4m3", "sglang:fp8_e5m2"):
        info = fidelity_of(KVSpec.parse(name))
        assert info["label"] == "source-faithful", name
        assert "sglang@000ccdba" in info["source"] and "memory_pool.py" in info["source"] and "flashinfer_backend.py" in info["source"]
    assert "NaN" in fidelity_of(KVSpec.parse("sglang:fp8_e4m3"))["differs"]  # older torch casts: not pinned


# ---- fidelity labels: derived here from the recorded checks, not from the code's constants --------

def _recorded():
    import json
    from pathlib import Path

    import wkvlab.kv

    data = json.loads((Path(wkvlab.kv.__file__).parent / "fidelity_checks.json").read_text(encoding="utf-8"))
    return data["band"], data["checks"]


def _expected_label(name: str, spec: KVSpec) -> str | None:
    """identity when nothing is quantized; engine-checked iff a recorded check the rule decided equivalent
    within the band names this exact preset and spec; otherwise anything but engine-checked (None)."""
    band, checks = _recorded()
    if spec.is_identity:
        return "identity"
    if any(c["preset"] == name and c["spec"] == spec.canonical() and _inside(c, band) for c in checks):
        return "engine-checked"
    return None


def _inside(check: dict, band: float) -> bool:
    """The rule decided the ratio equivalent within ±band: its Holm-adjusted interval lies inside 1 ± band
    (a point ratio, or a 95% interval without the rule's verdict, backs nothing)."""
    lo, hi = check.get("adjusted") or (0.0, float("inf"))
    return check.get("outcome") == "within" and check.get("verdict") == f"equivalent within ±{band:g}" and 1 - band <= lo and hi <= 1 + band


def test_every_recorded_check_is_complete_and_still_names_the_current_spec():
    band, checks = _recorded()
    assert band == 0.15 and len(checks) >= 5
    for c in checks:
        assert c["command"] and c["model"] and c["engine"] and c["engine_kld"] > 0 and c["sim_kld"] > 0
        assert c["ratio"] == pytest.approx(c["sim_kld"] / c["engine_kld"], abs=0.006)  # the ratio is what the two KLDs say
        # a preset whose spec changed since it was measured must be re-measured (or the row removed)
        assert KVSpec.parse(c["preset"]).canonical() == c["spec"], c


def test_every_listed_label_follows_from_the_recorded_checks():
    from wkvlab.listing import kv_preset_rows

    checked = set()
    for name, _spec, label, _source in kv_preset_rows():
        if "<" in name:
            assert not label.startswith("engine-checked"), name  # a pattern never borrows a member's check
            continue
        spec = KVSpec.parse(name)
        want = _expected_label(name, spec)
        if want:
            assert label.startswith(want), (name, label)
            checked.add(name) if want == "engine-checked" else None
        else:
            assert not label.startswith(("engine-checked", "identity", "bit-exact")), (name, label)
    band, checks = _recorded()
    assert checked == {c["preset"] for c in checks if _inside(c, band)}  # every check that backs the label, on its own row


def test_engine_checked_only_where_the_rule_decided_the_ratio_equivalent():
    # fidelity_checks.json (scripts/fidelity_table.py --record, Holm over each run's 5 cache types): SmolLM2's 32 windows
    # decided all five equivalent within ±0.15; Gemma's 16 decided q8_0, q5_0, q8_0/q4_0 and left q4_0 (1.12, adjusted
    # [0.98, 1.267]) and q4_1 (0.93, adjusted [0.85, 1.008]) undecided; the x86 rows are point ratios. The label names
    # the model, interval and verdict behind it, and the measurements that do not back it
    q4_0 = fidelity_of(KVSpec.parse("llamacpp:q4_0"))
    assert q4_0["label"] == "engine-checked"
    backed, _, not_backed = q4_0["differs"].partition(";")
    assert "0.99 [0.939, 1.046] (95%), Holm-adjusted [0.929, 1.056] → equivalent within ±0.15 on SmolLM2-135M" in backed
    assert "Gemma" not in backed and "not engine-checked there" in not_backed
    assert "1.12 [1.004, 1.243] (95%), Holm-adjusted [0.98, 1.267] → undecided on Gemma-3-270M" in not_backed
    q4_1 = fidelity_of(KVSpec.parse("llamacpp:q4_1"))
    assert q4_1["label"] == "engine-checked" and "0.93 [0.863, 0.995] (95%), Holm-adjusted [0.85, 1.008] → undecided on Gemma" in q4_1["differs"]
    q8_0 = fidelity_of(KVSpec.parse("llamacpp:q8_0"))
    assert q8_0["label"] == "engine-checked" and "Holm-adjusted [0.953, 1.026] → equivalent within ±0.15 on SmolLM2-135M" in q8_0["differs"]
    assert "Holm-adjusted [0.942, 1.054] → equivalent within ±0.15 on Gemma-3-270M" in q8_0["differs"] and "not engine-checked" not in q8_0["differs"]
    assert fidelity_of(KVSpec.parse("llamacpp-x86:q8_0"))["label"] == "source-faithful"
    assert "point ratio" in fidelity_of(KVSpec.parse("llamacpp-x86:q8_0"))["differs"]


def test_a_ratio_interval_without_the_rules_verdict_backs_no_label():
    """A check recorded before the rule decided it (a 95% interval inside the band, no outcome) is stated, not trusted."""
    from wkvlab.kv.presets import _check_text, supports_label

    old = {"preset": "llamacpp:q8_0", "model": "Gemma-3-270M (packaged gemma3-270m)", "ratio": 1.0, "interval": [0.983, 1.026]}
    assert not supports_label(old)
    assert _check_text(old) == "1.00 [0.983, 1.026] (95%, no verdict of the rule recorded) on Gemma-3-270M"
    assert not supports_label({**old, "outcome": "undecided", "verdict": "undecided", "adjusted": [0.9, 1.2]})
    assert supports_label({**old, "outcome": "within", "verdict": "equivalent within ±0.15", "adjusted": [0.95, 1.05]})


def test_labels_of_the_cases_the_review_found():
    assert fidelity_of(KVSpec.parse("llamacpp:q4_0+norot"))["label"] == "source-faithful"  # no ratio without rotation
    assert fidelity_of(KVSpec.parse("llamacpp:q5_1"))["label"] == "source-faithful"
    assert fidelity_of(KVSpec.parse("llamacpp:f16/q4_0"))["label"] == "source-faithful"  # only q8_0/q4_0 among pairs
    assert fidelity_of(KVSpec.parse("llamacpp:f16"))["label"] == "identity"
    assert fidelity_of(KVSpec.parse("llamacpp:q4_0+sinks=4"))["label"] == "approximate"  # not llama.cpp's any more
    assert "sinks=4" in fidelity_of(KVSpec.parse("kivi2+sinks=4"))["differs"]
    # an engine's own settings keep the preset source-faithful (QuantizedCache's prompt length and residual_length)
    assert fidelity_of(KVSpec.parse("hf-quanto:int4+prefill=512+residual=64"))["label"] == "source-faithful"
    assert fidelity_of(KVSpec.parse("hf-quanto:int4+sinks=2"))["label"] == "approximate"
    assert fidelity_of(KVSpec.parse("q4_0"))["label"] == "no preset"
    for name in preset_names():
        if "<" in name:
            continue
        preset = describe_preset(name.split("+")[0])
        assert preset.fidelity in FIDELITY
        assert preset.fidelity != "bit-exact"  # bit-exact holds for formats (gguf.quants), not for any whole preset
        if preset.fidelity == "approximate":
            assert preset.differs  # says what differs
    assert describe_preset("kivi2").fidelity == describe_preset("exl3:k2v2").fidelity == "source-faithful"
    assert describe_preset("vllm:int4_per_token_head").fidelity == "source-faithful"


def test_the_slow_engine_test_measures_exactly_the_default_models_checks():
    assert ENGINE_CHECKED_LLAMACPP == tuple(c["preset"].split(":")[1] for c in _recorded()[1]
                                            if c["model"].startswith("SmolLM2") and c["preset"].startswith("llamacpp:"))


# ---- llama.cpp: the x86 q8_0 writer and the fp16 Q of an f16 K -----------------------------------

def test_x86_q8_0_writer_hand_computed():
    # arch/x86/quants.c quantize_row_q8_0 (@04e1dd75): d = max/127 -> fp16; id = 127/max; _mm256_round_ps
    # to nearest EVEN. Block A: max 127 -> d = id = 1: ties 2.5 -> 2, -2.5 -> -2, 3.5 -> 4 (reference roundf: 3, -3, 4).
    # Block B: max 0.96774715 gives fl32(127/max) = 131.23262 but fl32(1/fl32(max/127)) = 131.23264, so
    # 0.011430084 * id is 1.4999999 -> 1 on x86 and 1.5 -> 2 in the reference (found with numpy float32).
    from wkvlab.formats import fake_quant_ggml
    from wkvlab.formats.ggml_x86 import fake_quant_q8_0_x86

    x = torch.zeros(2, 32)
    x[0, :4] = torch.tensor([127.0, 2.5, -2.5, 3.5])
    x[1, :2] = torch.tensor([0.96774715, 0.011430084])
    d_b = float(torch.tensor(0.96774715 / 127, dtype=torch.float32).to(torch.float16))
    got = fake_quant_q8_0_x86(x)
    assert got[0, :4].tolist() == [127.0, 2.0, -2.0, 4.0]
    assert got[1, :2].tolist() == [127 * d_b, 1 * d_b]
    ref = fake_quant_ggml(x, "q8_0")
    assert ref[0, :4].tolist() == [127.0, 3.0, -3.0, 4.0] and ref[1, 1].item() == 2 * d_b
    assert get_kv_format("q8_0-x86").bytes_per_vector(64) == get_kv_format("q8_0").bytes_per_vector(64) == 68


def test_llamacpp_x86_presets_use_the_x86_writer_for_cache_and_q():
    spec = KVSpec.parse("llamacpp-x86:q8_0/q4_0")
    assert (spec.k, spec.v, spec.q, spec.rotate) == ("q8_0-x86", "q4_0", "q8_0-x86", -2)
    assert KVSpec.parse("llamacpp-x86:q4_1").q == "q8_0-x86"  # q8_1's x86 writer gives the same codes
    assert fidelity_of(spec)["label"] == "source-faithful"  # its ratio was measured, but as a point (no interval)
    assert "0.97 (a point ratio" in fidelity_of(spec)["differs"]
    assert fidelity_of(KVSpec.parse("llamacpp-x86:q4_0"))["label"] == "source-faithful"  # this one's was not


def test_f16_k_beside_a_quantized_v_rounds_q_to_fp16():
    # ggml's CPU flash attention converts Q to K's vec_dot_type: fp16 for an f16 K
    model = tiny_llama()
    q = torch.full((1, 4, 1, 32), 1.0 + 2.0**-12)  # halfway between fp16 1.0 and 1 + 2^-10 -> 1.0 (even)
    k = v = torch.randn(1, 2, 1, 32)
    for name, want in (("llamacpp:f16/q4_0", 1.0), ("llamacpp:f16", 1.0 + 2.0**-12)):
        spec = KVSpec.parse(name)
        assert spec.q == ("fp16" if "/" in name else "none")
        store = layer_stores(model, spec)[0]
        q2 = store.apply(q, k, v)[0]
        assert torch.all(q2 == want), name


def test_the_planner_reads_each_engine_formats_bytes_from_the_spec():
    # Llama-3-70B: 80 layers x 8 KV heads x head_dim 128, K and V. Per (token, head, side):
    # vLLM *_per_token_head: 128 codes + one float32 scale = 132 B (KVQuantMode.*_PER_TOKEN_HEAD);
    # SGLang FP4 (mxfp4/blockfp4 recipes): 64 B of E2M1 + 128/16 uint8 exponents = 72 B (compute_cell_size,
    # without its dequant workspace, which is shared across layers); llama.cpp q8_0 on x86: 4 x 34 B = 136 B.
    from wkvlab.plan import ModelDescription, kv_bytes_per_token

    llama70 = ModelDescription.from_name("Llama-3-70B")
    for name, per_row in (("vllm:fp8_per_token_head", 132), ("vllm:int8_per_token_head", 132), ("sglang:fp4_e2m1", 72),
                          ("llamacpp-x86:q8_0", 136), ("vllm:int4_per_token_head", 68)):
        assert kv_bytes_per_token(llama70, name).total_bytes == per_row * 2 * 80 * 8, name
    # NVFP4 (vLLM nvfp4 / nvfp4_4over6: reshape_and_cache_nvfp4_dispatch's full_dim = head_size/2 + head_size/16;
    # SGLang NVFP4Method.compute_cell_size without the shared workspace): 64 + 8 = 72 B; the fp32 k_scale is per layer
    for name in ("vllm:nvfp4", "vllm:nvfp4_4over6", "sglang:fp4_e2m1+recipe=nvfp4", "sglang:fp4_e2m1+recipe=nvfp4-sm100", "sglang:nvfp4"):
        assert kv_bytes_per_token(llama70, name).total_bytes == 72 * 2 * 80 * 8, name


# ---- NVFP4: vLLM nvfp4 / nvfp4_4over6, SGLang --fp4-kv-cache-recipe ------------------------------

def test_nvfp4_presets_and_sglang_recipes_name_the_kernels_formats():
    assert KVSpec.parse("vllm:nvfp4").canonical() == "nvfp4"
    assert KVSpec.parse("vllm:nvfp4_4over6").canonical() == "nvfp4_4over6"
    # the FP4 recipes: mxfp4 and blockfp4 are one kernel (fp4_e2m1, SGLang's fp4_mx_block16); nvfp4 is NVFP4Method's
    # store as the decode reads it (FlashInfer's exact FP4 read: vLLM's nvfp4); on SM100 SGLang 0.5.20 multiplies
    # k_scale by 6 (nvfp4-sm100), 0.5.21 on only a checkpoint's (k_scale != 1.0): an uncalibrated model stores nvfp4
    for engine, recipe, fmt in (("sglang", "mxfp4", "fp4_e2m1"), ("sglang", "blockfp4", "fp4_e2m1"), ("sglang", "nvfp4", "nvfp4"),
                                ("sglang", "nvfp4-sm100", "nvfp4"), ("sglang@0.5.23", "nvfp4-sm100", "nvfp4"),
                                ("sglang@0.5.20", "nvfp4-sm100", "nvfp4-sm100"), ("sglang@0.5.20", "nvfp4", "nvfp4")):
        spec = KVSpec.parse(f"{engine}:fp4_e2m1+recipe={recipe}")
        assert (spec.k, spec.v) == (fmt, fmt) and KVSpec.parse(spec.canonical()) == KVSpec(k=fmt, v=fmt)
        assert spec.name == f"{engine}:fp4_e2m1+recipe={recipe}"
    # SGLang 0.5.23's own --kv-cache-dtype names
    assert KVSpec.parse("sglang:nvfp4").k == "nvfp4" and KVSpec.parse("sglang:fp4_mx_block16").k == "fp4_e2m1"
    with pytest.raises(ConfigError, match=r"SGLang version '0.4' is not modelled; use one of: 0.5.23, 0.5.20"):
        KVSpec.parse("sglang@0.4:nvfp4")
    for bad in ("sglang:fp4_e2m1+recipe=nvfp8", "int4+recipe=nvfp4", "vllm:nvfp4+recipe=nvfp4"):
        with pytest.raises(ConfigError, match="recipe"):
            KVSpec.parse(bad)
    # labels: read from source, no ratio measured -> source-faithful, never engine-checked; the recipe's source is named
    for name in ("vllm:nvfp4", "vllm:nvfp4_4over6", "sglang:fp4_e2m1+recipe=nvfp4", "sglang:fp4_e2m1+recipe=nvfp4-sm100", "sglang:nvfp4"):
        info = fidelity_of(KVSpec.parse(name))
        assert info["label"] == "source-faithful", name
    assert "nvfp4_kv_cache_kernels.cu @0cd789b3" in fidelity_of(KVSpec.parse("vllm:nvfp4"))["source"]
    # the GPU's rcp.approx(6) is an assumption, stated in every NVFP4 preset's differs (tests/formats/test_nvfp4_kv.py measures it)
    for name in ("vllm:nvfp4", "vllm:nvfp4_4over6", "sglang:nvfp4", "sglang:fp4_e2m1+recipe=nvfp4"):
        assert "0x3E2AAAAB" in fidelity_of(KVSpec.parse(name))["differs"]
    # SGLang 0.5.23 stores through flashinfer 0.7.2's nvfp4_kv_quantize, read in that wheel
    assert "nvfp4_kv_quantize(tensor_2d, global_scale) of flashinfer-python 0.7.2" in fidelity_of(KVSpec.parse("sglang:nvfp4"))["source"]
    assert "NVFP4Method" in fidelity_of(KVSpec.parse("sglang:fp4_e2m1+recipe=nvfp4"))["source"]
    assert "forward_decode" in fidelity_of(KVSpec.parse("sglang:fp4_e2m1+recipe=nvfp4-sm100"))["source"]
    assert fidelity_of(KVSpec.parse("sglang:nvfp4"))["source"].startswith("release modelled: SGLang 0.5.23")
    assert "k_scale != 1.0" in fidelity_of(KVSpec.parse("sglang:nvfp4"))["source"]
    assert "NVFP4Method" not in fidelity_of(KVSpec.parse("sglang:fp4_e2m1+recipe=mxfp4"))["source"]


def test_nvfp4_presets_quantize_a_model_layer_by_the_kernel_formula():
    # a block whose scale and codes are known by hand (tests/formats/test_nvfp4_kv.py): amax 1.3 -> E4M3 scale 0.21875,
    # codes 6, 2, -4, 0.5, 3. SGLang's decode reads them as vLLM's does (code x scale, exact); only an extend over a
    # cached prefix goes through the FP8 workspace, which turns 1.3125 into 1.25 and 0.65625 into 0.625.
    # SM100 (k_scale 6): e4m3(1.3 * rcp(6) / 6) = e4m3(0.036111) = 9/256; rcp(9/256 * 6) = 4.7407 scales the block to
    # 6.163, 2.370, -4.267, 0.474, 3.081 -> codes 6, 2, -4, 0.5, 3, read as code * 9/256 * 6 = code * 0.2109375
    x = torch.zeros(1, 1, 2, 64)
    x[..., :5] = torch.tensor([1.3, 0.5, -0.9, 0.1, 0.65])
    exact = [1.3125, 0.4375, -0.875, 0.109375, 0.65625]
    sm100 = [1.265625, 0.421875, -0.84375, 0.10546875, 0.6328125]
    # SGLang 0.5.21 on (0.5.23 the newest modelled): x6 on SM100 only for a checkpoint's k_scale -> uncalibrated SM100 = exact
    for name, want in (("vllm:nvfp4", exact), ("sglang:fp4_e2m1+recipe=nvfp4", exact), ("sglang:fp4_e2m1+recipe=nvfp4-sm100", exact),
                       ("sglang:nvfp4", exact), ("sglang@0.5.20:fp4_e2m1+recipe=nvfp4-sm100", sm100),
                       ("nvfp4-fp8read", [1.25, 0.4375, -0.875, 0.109375, 0.625])):
        spec = KVSpec.parse(name)
        out = spec.k_format.quantize(x)
        assert out[0, 0, 0, :5].tolist() == want and out[..., 5:].abs().max().item() == 0.0, name
    # the MXFP4/blockfp4 recipe on the same block: scale 2^ceil(log2(1.3/6)) = 0.25, |x|/0.25 = 5.2, 2, 3.6, 0.4, 2.6 ->
    # 6, 2, 4, 0.5, 3 (sum of bounds passed) -> 1.5, 0.5, -1.0, 0.125, 0.75
    out = KVSpec.parse("sglang:fp4_e2m1+recipe=mxfp4").k_format.quantize(x)
    assert out[0, 0, 0, :5].tolist() == [1.5, 0.5, -1.0, 0.125, 0.75]


def test_exl3_fa_0_0_28_lets_the_current_token_see_its_own_kv_unquantized():
    # ExLlamaV3 0.0.28 exllamav3/modules/attn.py: flash_attn_with_kvcache(q, k, v, k_cache=dequantized old, ...) and
    # only then update_layer quantizes the new K/V. With one token there is no old cache: exl3-fa@0.0.28 gives
    # exactly the unquantized logits; 1.6.5 (exl3-fa:, the default) quantizes the chunk's own K/V first.
    from wkvlab.kv.hook import kv_quantization

    model = tiny_llama()
    ids = torch.tensor([[5, 9, 17]])
    with torch.no_grad():
        ref = model(ids).logits
        with kv_quantization(model, KVSpec.parse("exl3-fa@0.0.28:k2v2")):
            old = model(ids).logits
        with kv_quantization(model, KVSpec.parse("exl3-fa:k2v2")):
            direct = model(ids).logits
    assert KVSpec.parse("exl3-fa@0.0.28:k2v2").pastonly and not KVSpec.parse("exl3-fa:k2v2").pastonly
    torch.testing.assert_close(old[0, 0], ref[0, 0], rtol=0, atol=1e-6)  # the first token sees only itself
    assert not torch.allclose(direct[0, 0], ref[0, 0], atol=1e-4)
    assert not torch.allclose(old[0, 2], ref[0, 2], atol=1e-4)  # later tokens see the earlier ones quantized


def test_exl3_fa_follows_the_exllamav3_releases_of_the_table():
    # 1.6.5 (attn_dispatch -> update_kv_direct, then the qc kernels with k=None, v=None): the exl3: spec, midpoint grid;
    # 0.0.28: the old read (+pastonly) and that release's lrintf grid (engines.yaml kv_formats exl3_<b> -> exl3rn_<b>)
    new, old, same = (describe_preset(n) for n in ("exl3-fa:k4v2", "exl3-fa@0.0.28:k4v2", "exl3-fa@1.6.5:k4v2"))
    assert (new.spec.k, new.spec.v, new.spec.pastonly) == ("exl3_4", "exl3_2", False)
    assert (old.spec.k, old.spec.v, old.spec.pastonly) == ("exl3rn_4", "exl3rn_2", True)
    assert new.spec.canonical() == KVSpec.parse("exl3:k4v2").canonical() == same.spec.canonical()
    assert (new.release.label, old.release.label, old.release.commit) == ("ExLlamaV3 1.6.5", "ExLlamaV3 0.0.28", "ea87af6ea")
    assert "update_kv_direct" in new.source and "fp16 queries" in new.differs and "get_layer" in old.source
    assert KVSpec.parse("exl3-fa@0.0.28:k4v4").bytes_per_token(layers=1, kv_heads=1, head_dim=128) == 2 * (128 * 4 / 8 + 8)
    with pytest.raises(ConfigError, match="ExLlamaV3 version '0.0.5' is not modelled; use one of: 1.6.5, 0.0.28"):
        KVSpec.parse("exl3-fa@0.0.5:k4v4")
    with pytest.raises(ConfigError, match="presets take @<release> for exl3-fa"):
        KVSpec.parse("exl3@1.6.5:k4v4")


def test_per_token_head_presets_name_the_revision_they_were_re_read_at():
    # issue #25 item 3: the per-token-head writers re-read in vLLM's newest stored copy (moved to triton_quant_kv/)
    assert "@18829594" in describe_preset("vllm:int4_per_token_head").source
    # issue #39: the int8/fp8 store as released: 0.34.0 rounds (@62d4bc3c7), 0.23.0 truncates (@91df0fad4)
    for name in ("vllm:int8_per_token_head", "vllm:fp8_per_token_head"):
        assert "@62d4bc3c7" in describe_preset(name).source and "@91df0fad4" in describe_preset(name).source
    assert fidelity_of(KVSpec.parse("vllm:int8_per_token_head"))["release"] == "vLLM 0.34.0 @62d4bc3c7"
    old = fidelity_of(KVSpec.parse("vllm@0.23:int8_per_token_head"))
    assert old["release"] == "vLLM 0.23.0 @91df0fad4" and old["label"] == "source-faithful" and "INT8 Triton stores truncate" in old["source"]
