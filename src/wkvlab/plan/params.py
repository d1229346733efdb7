"""Parameter inventory: every weight matrix a quantizer would touch, and everything it would not.

Engines quantize the linear layers inside the transformer blocks (attention projections, MLP,
experts) and keep the rest in 16 bit: token embeddings, lm_head, norms, biases, MoE routers,
causal-conv kernels of linear-attention layers. The inventory is per layer so that a weight spec
can keep chosen layers at 16 bit, and marks routed-expert matrices because a decode step reads
only the experts its tokens were routed to.
"""
from __future__ import annotations

from dataclasses import dataclass

from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.models import FULL, LINEAR, SLIDING, ModelDescription


# How tensor parallelism splits a matrix (vLLM/SGLang layers of the same names):
# column = output features split across ranks (ColumnParallelLinear, QKV, gate/up);
# row = input features split (RowParallelLinear: o_proj, down_proj);
# kv = the K/V part of QKVParallelLinear: split by KV head, replicated when tp > KV heads;
# replicated = whole on every rank (MLA's low-rank a-projections, ReplicatedLinear).
COLUMN, ROW, KV_HEADS, REPLICATED = "column", "row", "kv", "replicated"


@dataclass(frozen=True)
class Linear(JsonMixin):
    """``count`` matrices of shape out_features x in_features in one layer."""

    layer: int
    name: str
    in_features: int
    out_features: int
    count: int = 1
    routed_expert: bool = False
    parallel: str = COLUMN

    @property
    def params(self) -> int:
        return self.in_features * self.out_features * self.count

    @property
    def module_name(self) -> str:
        """The Hugging Face module name a weight spec's regexes (``override=``, ``skip-re=``) are matched against."""
        block, _, proj = self.name.partition(".")
        parent = {"attn": "self_attn", "experts": "mlp.experts.0", "shared_expert": "mlp.shared_expert"}.get(block, block)
        proj = {"gate_up_proj": "gate_proj"}.get(proj, proj)
        return f"model.layers.{self.layer}.{parent}.{proj}"


@dataclass(frozen=True)
class Leftover(JsonMixin):
    """Parameters that stay unquantized; ``kind`` groups them in a breakdown."""

    kind: str  # embedding | lm_head | norm | bias | router | conv
    params: int
    layer: int | None = None


def linear_inventory(model: ModelDescription) -> tuple[Linear, ...]:
    """All quantizable linear layers, layer by layer."""
    out: list[Linear] = []
    for layer, kind in enumerate(model.layer_types):
        if kind in (FULL, SLIDING):
            out.extend(_attention_linears(model, layer))
        elif kind == LINEAR and model.linear_attention is not None:
            la = model.linear_attention
            h = model.hidden_size
            out += [Linear(layer, "linear_attn.in_proj_qkvz", h, 2 * la.key_dim + 2 * la.value_dim),
                    Linear(layer, "linear_attn.in_proj_ba", h, 2 * la.num_value_heads),
                    Linear(layer, "linear_attn.out_proj", la.value_dim, h, parallel=ROW)]
        out.extend(_mlp_linears(model, layer))
    return tuple(out)


def leftover_inventory(model: ModelDescription) -> tuple[Leftover, ...]:
    """Embeddings, lm_head, norms, biases, routers and conv kernels (kept 16-bit)."""
    h = model.hidden_size
    out = [Leftover("embedding", model.vocab_size * h)]
    if not model.tie_embeddings:  # tied embeddings are one tensor, counted once
        out.append(Leftover("lm_head", model.vocab_size * h))
    out.append(Leftover("norm", h))  # final norm
    for layer, kind in enumerate(model.layer_types):
        norms = model.norms_per_layer * h
        if kind in (FULL, SLIDING):
            if model.qk_norm:
                norms += 2 * model.head_dim
            if model.mla is not None:
                norms += model.mla.kv_lora_rank + (model.mla.q_lora_rank or 0)
            if model.attention_bias and model.mla is None:
                q = model.num_heads * model.head_dim
                out.append(Leftover("bias", q + 2 * model.num_kv_heads * model.head_dim, layer))
        elif kind == LINEAR and model.linear_attention is not None:
            la = model.linear_attention
            norms += la.value_head_dim
            conv = (2 * la.key_dim + la.value_dim) * la.conv_kernel
            out.append(Leftover("conv", conv + 2 * la.num_value_heads, layer))  # + A_log, dt_bias
        out.append(Leftover("norm", norms, layer))
        if model.is_moe_layer(layer):
            moe = model.moe
            assert moe is not None
            router = h * moe.num_experts
            if moe.shared_expert_intermediate_size:
                router += h  # Qwen's sigmoid gate on the shared expert
            out.append(Leftover("router", router, layer))
    return tuple(out)


def parameter_count(model: ModelDescription) -> int:
    return sum(x.params for x in linear_inventory(model)) + sum(
        x.params for x in leftover_inventory(model))


def active_linear_params(model: ModelDescription) -> int:
    """Linear parameters one token multiplies with (routed experts: only its top-k)."""
    total = 0
    for lin in linear_inventory(model):
        if lin.routed_expert:
            assert model.moe is not None
            total += lin.params * model.moe.experts_per_token // model.moe.num_experts
        else:
            total += lin.params
    return total


def _attention_linears(model: ModelDescription, layer: int) -> list[Linear]:
    h, heads = model.hidden_size, model.num_heads
    if model.mla is not None:
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = ([Linear(layer, "attn.q_a_proj", h, m.q_lora_rank, parallel=REPLICATED),
              Linear(layer, "attn.q_b_proj", m.q_lora_rank, heads * qk)]
             if m.q_lora_rank else [Linear(layer, "attn.q_proj", h, heads * qk)])
        return q + [Linear(layer, "attn.kv_a_proj_with_mqa", h, m.kv_lora_rank + m.qk_rope_head_dim, parallel=REPLICATED),
                    Linear(layer, "attn.kv_b_proj", m.kv_lora_rank,
                           heads * (m.qk_nope_head_dim + m.v_head_dim)),
                    Linear(layer, "attn.o_proj", heads * m.v_head_dim, h, parallel=ROW)]
    q_out = heads * model.head_dim * (2 if model.attn_output_gate else 1)
    kv_out = model.num_kv_heads * model.head_dim
    return [Linear(layer, "attn.q_proj", h, q_out),
            Linear(layer, "attn.k_proj", h, kv_out, parallel=KV_HEADS),
            Linear(layer, "attn.v_proj", h, kv_out, parallel=KV_HEADS),
            Linear(layer, "attn.o_proj", heads * model.head_dim, h, parallel=ROW)]


def _mlp_linears(model: ModelDescription, layer: int) -> list[Linear]:
    h = model.hidden_size
    if not model.is_moe_layer(layer):
        i = model.intermediate_size
        # Every architecture in scope uses a gated MLP: gate and up (h -> i), down (i -> h).
        return [Linear(layer, "mlp.gate_up_proj", h, i, count=2), Linear(layer, "mlp.down_proj", i, h, parallel=ROW)]
    moe = model.moe
    assert moe is not None
    e, i = moe.num_experts, moe.expert_intermediate_size
    out = [Linear(layer, "experts.gate_up_proj", h, i, count=2 * e, routed_expert=True),
           Linear(layer, "experts.down_proj", i, h, count=e, routed_expert=True, parallel=ROW)]
    shared = moe.shared_experts * i + moe.shared_expert_intermediate_size
    if shared:
        out += [Linear(layer, "shared_expert.gate_up_proj", h, shared, count=2),
                Linear(layer, "shared_expert.down_proj", shared, h, parallel=ROW)]
    return out
