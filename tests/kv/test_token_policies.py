"""Separate key and value token policies: KIVI's rules, past-only quantization, streaming equality."""
import pytest
import torch

from tests.conftest import tiny_gemma3, tiny_llama, tiny_mistral, tiny_qwen3
from tests.kv.test_streaming import assert_streams_as_forced
from wkvlab.errors import ConfigError
from wkvlab.kv import KVSpec, kv_quantization
from wkvlab.kv.attention import KVSelection, mixed_attention
from wkvlab.kv.hook import layer_stores

# KIVI's rule at a small scale (R = 8, groups of 4 tokens), so a short stream passes every window
SMALL_KIVI = "int2-c4/int2-g32-asym+k_residual=8+v_window=9"


def _kivi_decode_state(n_tokens: int, residual: int) -> tuple[list[set], list[set]]:
    """Replay jy-yuan/KIVI models/llama_kivi.py's decoding, token by token (no prefill).

    Returns, per query t, the positions whose key / value the query sees quantized. Keys: the
    new key joins ``key_states_full``, attention runs, then a full buffer of ``residual`` keys is
    flushed to the quantized part. Values: the new value joins ``value_states_full``, attention
    runs, then if more than ``residual`` are held the oldest one is quantized.
    """
    key_q, key_full, val_q, val_full = [], [], [], []
    seen_k, seen_v = [], []
    for t in range(n_tokens):
        key_full.append(t)
        val_full.append(t)
        seen_k.append(set(key_q))
        seen_v.append(set(val_q))
        if len(key_full) == residual:
            key_q += key_full
            key_full = []
        if len(val_full) > residual:
            val_q.append(val_full.pop(0))
    return seen_k, seen_v


def _selected(selection, n):
    mask = selection(torch.arange(n), n)
    return [set(torch.nonzero(mask[t]).flatten().tolist()) for t in range(n)]


@pytest.mark.parametrize("name,residual", [("kivi2", 128), ("kivi4", 128), (SMALL_KIVI, 8)])
def test_kivi_presets_follow_llama_kivi_decoding_exactly(name, residual):
    n = 3 * residual + 5  # several flushes and a value window that has slid
    want_k, want_v = _kivi_decode_state(n, residual)
    spec = KVSpec.parse(name)
    k_fmt, v_fmt = spec.formats_for(0)
    k_policy, v_policy = spec.token_policies(k_fmt, v_fmt)
    assert _selected(k_policy.selection(), n) == want_k
    assert _selected(v_policy.selection(), n) == want_v
    # what a stream of n tokens holds quantized at each step follows the same rule
    for t in (residual - 1, residual, 2 * residual + 3, n - 1):
        assert k_policy.quantized_prefix(t, 1) == len(want_k[t]) and v_policy.quantized_prefix(t, 1) == len(want_v[t])


def test_kivi_values_are_a_sliding_window_not_a_flushed_residual():
    # query 200: KIVI holds values 72..200 at full precision (the last 128 before it, plus itself);
    # a residual flushed in blocks of 128 would have quantized values 0..127 already
    spec = KVSpec.parse("kivi2")
    _, v_policy = spec.token_policies(*spec.formats_for(0))
    row = v_policy.selection()(torch.tensor([200]), 201)[0]
    assert row[:72].all() and not row[72:].any()
    assert spec.canonical() == "int2-c32-asym/int2-g32-asym+k_residual=128+v_window=129"
    assert KVSpec.from_dict(spec.to_dict()) == spec
    assert KVSpec.parse(spec.canonical()).token_policies(*spec.formats_for(0)) == spec.token_policies(*spec.formats_for(0))


def test_side_options_normalize_and_validate():
    assert KVSpec.parse("int4+k_residual=8+v_residual=8") == KVSpec.parse("int4+residual=8")
    both = KVSpec.parse("int4+residual=8+v_window=9")
    assert (both.residual, both.k_residual, both.v_window) == (0, 8, 9)
    assert KVSpec.parse(both.label) == both
    with pytest.raises(ConfigError, match="not both"):
        KVSpec.parse("int4+v_residual=8+v_window=9")
    with pytest.raises(ConfigError, match="closed groups"):
        KVSpec.parse("int2-c4/int2+k_window=8")
    # values per token no longer wait for the keys' token groups
    spec = KVSpec.parse("int2-c4/int2")
    k_policy, v_policy = spec.token_policies(*spec.formats_for(0))
    assert (k_policy.residual, v_policy.depends_on_query) == (4, False)


def test_bytes_count_each_sides_full_precision_tokens():
    shape = dict(layers=1, kv_heads=1, head_dim=64, context=1024)
    spec = KVSpec.parse("q8_0+k_residual=128+v_window=256")
    k = 128 / 1024 * 128 + (1 - 128 / 1024) * 68
    v = 256 / 1024 * 128 + (1 - 256 / 1024) * 68
    assert spec.bytes_per_token(**shape) == pytest.approx(k + v)


def test_past_only_keeps_each_tokens_own_kv_at_model_precision():
    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 24))
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits
        with kv_quantization(model, KVSpec.parse("int2+pastonly")):
            past = model(input_ids=ids, use_cache=False).logits
        with kv_quantization(model, KVSpec.parse("int2")):
            plain = model(input_ids=ids, use_cache=False).logits
    # position 0 attends only to itself: exact with past-only, not without
    torch.testing.assert_close(past[0, 0], ref[0, 0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(plain[0, 0], ref[0, 0], atol=1e-3)
    assert (past - ref).abs().mean() < (plain - ref).abs().mean()
    assert KVSpec.parse("int2+pastonly").label == "int2+pastonly"


STREAMED = [SMALL_KIVI, "int4+pastonly", "int2+residual=8+pastonly", "int2+v_window=5", "int2+k_window=6+v_residual=4",
            "q4_0+k_residual=8", "llamacpp:q4_0+pastonly"]


@pytest.mark.parametrize("build", [tiny_llama, tiny_qwen3, tiny_gemma3, tiny_mistral])
@pytest.mark.parametrize("text", STREAMED)
def test_streaming_equals_teacher_forced_for_every_token_policy(build, text):
    model = build()
    ids = torch.randint(0, 128, (40,))  # past every window and residual here (9 at most) and Gemma's sliding window of 8
    assert_streams_as_forced(model, KVSpec.parse(text), ids)  # float64: see tests/kv/test_streaming.py


def test_real_kivi2_streams_past_its_residual_and_window():
    model = tiny_llama(num_hidden_layers=1)
    ids = torch.randint(0, 128, (300,))  # > 2 flushes of 128 keys and a value window of 129 that has slid
    forced = assert_streams_as_forced(model, KVSpec.parse("kivi2"), ids)
    with torch.no_grad():
        ref = model(input_ids=ids[None], use_cache=False).logits[0]
    torch.testing.assert_close(forced[:128], ref[:128], rtol=1e-5, atol=1e-5)  # no key flushed, no value old enough
    assert not torch.allclose(forced[200:], ref[200:], atol=1e-4)


def test_mixed_attention_takes_a_selection_per_side_and_a_query_offset():
    torch.manual_seed(0)
    q, k, kq, v, vq = (torch.randn(1, h, 12, 8) for h in (2, 1, 1, 1, 1))
    every = lambda qp, n: torch.ones(len(qp), n, dtype=torch.bool)  # noqa: E731
    none = lambda qp, n: torch.zeros(len(qp), n, dtype=torch.bool)  # noqa: E731
    keys_only = mixed_attention(q, k, kq, v, vq, None, scaling=0.3, selection=KVSelection(every, none))
    mixed = mixed_attention(q, kq, kq, v, v, None, scaling=0.3, selection=every)
    torch.testing.assert_close(keys_only, mixed)
    # a chunk of the last 5 queries at offset 7 against the full history equals the tail of the whole pass
    whole = mixed_attention(q, k, kq, v, vq, None, scaling=0.3, selection=KVSelection(every, None))
    tail = mixed_attention(q[:, :, 7:], k, kq, v, vq, None, scaling=0.3, selection=KVSelection(every, None), query_offset=7)
    torch.testing.assert_close(tail, whole[:, 7:])


def test_layer_store_exposes_per_side_selections():
    model = tiny_llama()
    store = layer_stores(model, KVSpec.parse(SMALL_KIVI))[0]
    sel = store.selection
    assert isinstance(sel, KVSelection) and sel.k is not None and sel.v is not None
    assert layer_stores(model, KVSpec.parse("int4"))[0].selection is None


def test_quantized_cache_prefill_timing_by_hand():
    # transformers' QuantizedLayer.update with a 3-token prompt and residual_length 4: the prompt is
    # quantized at prefill but attends unquantized; tokens 3..5 pile up, token 6 makes the residual
    # full (3 + 1 >= 4) and the whole cache 0..6 is re-quantized after it attends, token 10 likewise.
    spec = KVSpec.parse("int4-g64-asym+residual=4+prefill=3")
    select = spec.selection()
    got = select(torch.arange(12), 12)
    quantized_below = [0, 0, 0, 3, 3, 3, 3, 7, 7, 7, 7, 11]
    want = torch.arange(12)[None, :] < torch.tensor(quantized_below)[:, None]
    assert torch.equal(got, want)
    k_policy, _ = spec.token_policies(spec.k_format, spec.v_format)
    assert [k_policy.quantized_prefix(t, 1) for t in range(12)] == quantized_below
    with pytest.raises(ConfigError, match="needs residual"):
        KVSpec.parse("int4+prefill=3")


def test_quanto_exact_prompt_only_for_one_group_on_hf_quanto():
    # optimum-quanto keeps a prompt tensor of exactly one group of 64 exact: kv_heads · prefill · head_dim == 64
    from types import SimpleNamespace

    from transformers import FalconConfig, LlamaConfig

    from wkvlab.kv.override import model_kv_heads
    from wkvlab.kv.tokens import quanto_prompt_exact

    assert quanto_prompt_exact(1 * 1 * 64, 64) and not quanto_prompt_exact(2 * 1 * 64, 64) and not quanto_prompt_exact(64, None)
    one_head = {s.k_policy.prompt_exact for s in layer_stores(tiny_llama(head_dim=64, num_attention_heads=2, num_key_value_heads=1,
                                                                       hidden_size=128), KVSpec.parse("hf-quanto:int4"))}
    two_heads = {s.k_policy.prompt_exact for s in layer_stores(tiny_llama(head_dim=64, num_attention_heads=2, num_key_value_heads=2,
                                                                        hidden_size=128), KVSpec.parse("hf-quanto:int4"))}
    longer = {s.v_policy.prompt_exact for s in layer_stores(tiny_llama(head_dim=64, num_attention_heads=2, num_key_value_heads=1,
                                                                     hidden_size=128), KVSpec.parse("hf-quanto:int4+prefill=2"))}
    plain = {s.k_policy.prompt_exact for s in layer_stores(tiny_llama(head_dim=64, num_attention_heads=2, num_key_value_heads=1,
                                                                    hidden_size=128), KVSpec.parse("int4-g64-asym+residual=128+prefill=1"))}
    assert one_head == {True} and two_heads == longer == plain == {False}
    # Falcon-7B: multi_query on the original decoder builds one K/V head whatever num_kv_heads says (71 by default)
    model = lambda cfg: SimpleNamespace(config=cfg)  # noqa: E731
    assert model_kv_heads(model(FalconConfig(hidden_size=4544, num_attention_heads=71, multi_query=True))) == 1
    assert model_kv_heads(model(FalconConfig(hidden_size=8192, num_attention_heads=128, new_decoder_architecture=True, num_kv_heads=8))) == 8
    assert model_kv_heads(model(LlamaConfig(num_attention_heads=8, num_key_value_heads=2))) == 2
