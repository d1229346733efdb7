"""The catastrophe guard: what the planner must never recommend, and what it must not recommend blind.

**Unsafe** — a measured configuration (``--probe``, ``--results`` or ``--store``) whose mean KLD
to the 16-bit model exceeds :data:`UNSAFE_KLD` nats/token, or whose top-1 agreement with it is below
:data:`UNSAFE_TOP1`, is marked unsafe: it gets no rank and no launch line, and the launch lines say
it was dropped and why. A weight or KV format measured unsafe on the model's own weights (or with
its 16-bit cache) makes every combination holding it unsafe too: the other half's error only adds.
The thresholds sit far above what a working 4-bit configuration costs (q4_0 weights 0.07, a
4-bit cache 0.05 in ``data/quality_priors.yaml``; an 8-bit cache a few thousandths) and far below
the collapse they guard against: a per-token 4-bit key cache on a model with outlier key channels
(Qwen2/Qwen2.5 with their QKV bias are the known case) loses more than 1 nat and most of its top-1
agreement, where per-channel keys (KIVI) or an 8-bit cache cost a few thousandths.

**Unmeasured** — without a measurement, a key cache stored per token below :data:`RISKY_K_BITS`
bits (``int4``, ``q4_0``, ``llamacpp:q4_0``, ...: one scale per token and head or block, which a
single outlier channel sets for every other channel) is the configuration that collapses on such
models; no prior can say whether this model is one of them, so its rows and launch lines say
:data:`UNMEASURED`. Per-channel keys (``int4-c32``, KIVI, KVQuant's ``nuq-c``) and 8-bit or wider
formats are not flagged.
"""
from __future__ import annotations

from wkvlab.kv.formats import KVFormat
from wkvlab.kv.spec import KVSpec
from wkvlab.plan.models import SLIDING, ModelDescription

UNSAFE_KLD = 0.1  # nats/token: a measured mean KLD above this is a broken model, not a trade-off
UNSAFE_TOP1 = 0.90  # a measured top-1 agreement below this is a broken model
RISKY_K_BITS = 8  # per-token key formats below this many bits per value (scales included) are at risk
UNMEASURED = "unmeasured on this model"  # every prior row: never recommended (plan/verdict.py)


def thresholds() -> str:
    """The rule in words (tables, notes, docs)."""
    return f"unsafe = measured KLD > {UNSAFE_KLD:g} nat or top-1 agreement < {UNSAFE_TOP1:.0%}"


def unsafe_reason(kld: float, top1: float | None) -> str:
    """Why a measurement is unsafe ('' when it is not)."""
    why = []
    if kld > UNSAFE_KLD:
        why.append(f"KLD {kld:.3f} > {UNSAFE_KLD:g} nat")
    if top1 is not None and top1 < UNSAFE_TOP1:
        why.append(f"top-1 agreement {top1:.1%} < {UNSAFE_TOP1:.0%}")
    return ", ".join(why)


def _per_token_low_bits(fmt: KVFormat, head_dim: int) -> bool:
    if fmt.is_identity or fmt.token_group is not None or fmt.calibrated or fmt.requantizes:
        return False
    return fmt.bytes_per_vector(head_dim) * 8 / head_dim < RISKY_K_BITS


def risky_keys(spec: KVSpec, model: ModelDescription) -> str:
    """The per-token key format below :data:`RISKY_K_BITS` bits that ``spec`` uses on ``model`` ('' if none)."""
    if model.mla is not None:
        return ""  # a latent, not per-channel keys: this rule does not describe it
    for layer in model.kv_layers:
        k, _ = spec.formats_for(layer, model.layer_types[layer] == SLIDING)
        if _per_token_low_bits(k, model.head_dim):
            return k.name
    return ""
