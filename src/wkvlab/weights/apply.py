"""Apply a weight spec to a model: a quantized copy plus a report of what changed.

By default the reference model is never modified: each weight config gets its own deep copy. With
``in_place=True`` (the one-model plan, :mod:`wkvlab.eval.memory`) the loaded model itself is
quantized; its original weights wait in a :class:`~wkvlab.weights.restore.WeightSnapshot`
(``originals``), which says whether the config changed anything and writes them back afterwards.
Whether a config is lossless on the checkpoint is read from the weights it would replace — the
reference's (a copy's source) or the snapshot's — never from a clone. The steps, in order:

1. resolve which spec each linear and each fused MoE expert matrix gets (16-bit skips, overrides;
   :func:`resolve_linears`, :func:`resolve_experts`), refusing what the model cannot take whole
   (:func:`check_quantizable`: offloaded layers, unknown fused tensors, experts under AWQ,
   SmoothQuant or activation quantization) before anything changes;
2. SmoothQuant and AWQ fold their per-channel scales (and AWQ clips) on the unquantized weights;
3. round-to-nearest for every linear whose method ends in RTN (rtn, awq, smoothquant, llm-int8)
   and every RTN expert matrix (:mod:`wkvlab.weights.experts`);
4. GPTQ layer by layer on the model quantized so far (expert matrices on their routed tokens);
5. static activation scales from calibration on the quantized model, then one forward pre-hook per
   activation-quantized linear (:mod:`wkvlab.weights.activations`), so they die with the copy.
"""
from __future__ import annotations

import copy
import functools
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from wkvlab.errors import ConfigError
from wkvlab.models.cache import weight_cache_enabled
from wkvlab.weights.activations import ActivationQuant, attach_activation_quantizers
from wkvlab.weights.arch import architecture_of, decoder_layers, layers_prefix, text_config
from wkvlab.weights.awq import awq_layer
from wkvlab.weights.calibration import CalibrationSet
from wkvlab.weights.capture import capture_layer_inputs
from wkvlab.weights.experts import GATED, ExpertMatrix, expert_matrices, fused_experts, gated_hookable, unknown_fused
from wkvlab.weights.gptq import gptq_layers
from wkvlab.weights.rtn import quantize_weight, ragged_group_note
from wkvlab.weights.storage import weight_storage_bytes
from wkvlab.weights.smoothquant import observe_model, smooth_model
from wkvlab.weights.spec import STATIC_ACTIVATIONS, WeightSpec
from wkvlab.weights.support import BALANCED_METHODS, expert_refusal, unknown_experts_refusal

# (what was just done, fraction of this build): per-layer progress of the calibrated methods.
BuildProgress = Callable[[str, float], None]

def decoder_linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    """Linear layers inside the language model's decoder blocks (not a vision tower's); embeddings
    and lm_head stay at 16 bits, as engines keep them."""
    prefix = layers_prefix(model)
    return [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith(prefix)]


def _layer_of(name: str, prefix: str) -> int:
    return int(name[len(prefix):].split(".", 1)[0])


@dataclass
class QuantizedWeights:
    """A weight-quantized copy of a model and the facts about it."""

    spec: WeightSpec
    model: torch.nn.Module
    weight_bytes: int
    lossless: bool  # every quantized weight came back unchanged: the checkpoint already sits on this grid
    notes: list[str] = field(default_factory=list)
    activations: dict[str, ActivationQuant] = field(default_factory=dict)
    calibration: str | None = None  # CalibrationSet.key it was built with
    cached: bool = False  # loaded from the on-disk cache
    hooks: list = field(default_factory=list, repr=False)  # activation pre-hooks, removed when an in-place build is undone
    # decoder linear and expert weights this config quantized, as a fraction of all of them (None: not known, a checkpoint)
    quantized_fraction: float | None = None


def _resolve(model: torch.nn.Module, spec: WeightSpec, named: list[tuple[str, object]], prefix: str) -> dict:
    if spec.is_identity:
        return {}
    n_layers = len(decoder_layers(model))
    spec.check_layers(n_layers)
    out = {}
    for name, target in named:
        sub = spec.for_linear(name, _layer_of(name, prefix), n_layers)
        if sub is not None:
            out[name] = (target, sub)
    return out


def resolve_linears(model: torch.nn.Module, spec: WeightSpec) -> dict[str, tuple[torch.nn.Linear, WeightSpec]]:
    """Each decoder linear that ``spec`` quantizes, with the spec that applies to it."""
    return _resolve(model, spec, decoder_linears(model), layers_prefix(model))


def all_experts(model: torch.nn.Module) -> list[tuple[str, ExpertMatrix]]:
    """Every expert matrix of the decoder's fused MoE tensors (``<experts>.<param>.<expert>``)."""
    prefix = layers_prefix(model)
    return [pair for name, module in fused_experts(model, prefix) for pair in expert_matrices(name, module)]


def resolve_experts(model: torch.nn.Module, spec: WeightSpec) -> dict[str, tuple[ExpertMatrix, WeightSpec]]:
    """Each fused expert matrix that ``spec`` quantizes (by the same skips and overrides as linears)."""
    return _resolve(model, spec, all_experts(model), layers_prefix(model))


def check_quantizable(model: torch.nn.Module, specs) -> None:
    """Refuse, in one line and before any work, weight configs this loaded model cannot take whole:
    offloaded layers, fused tensors of an unknown layout, MoE experts under a method that does not
    apply to them, AWQ/SmoothQuant without an architecture mapping."""
    specs = [s for s in specs if not (s.is_identity or s.is_checkpoint)]
    if not specs:
        return
    offloaded = offloaded_modules(model)
    if offloaded:
        raise ConfigError(f"{len(offloaded)} module(s) of the model (e.g. {offloaded[0]}) were offloaded by accelerate to the CPU or "
                          "disk, where their weights are not the modules' parameters and cannot be quantized; give the run a device "
                          "that holds the whole model (--device cpu, more GPUs), or evaluate only --kv configs")
    prefix = layers_prefix(model)
    unknown = unknown_fused(model, prefix)
    if unknown:
        owner = type(model.get_submodule(unknown[0].rpartition('.')[0])).__name__
        raise ConfigError(unknown_experts_refusal(unknown[0], f"a fused {model.get_parameter(unknown[0]).dim()}-D weight in {owner}"))
    where = f"{type(model).__name__} ({getattr(text_config(model), 'model_type', '?')})"
    for spec in specs:
        for name, (matrix, sub) in resolve_experts(model, spec).items():
            reason = expert_refusal(sub, where)
            if reason is None and sub.activations != "none" and not gated_hookable(matrix.module):
                impl = getattr(getattr(matrix.module, "config", None), "_experts_implementation", None)
                reason = (f"{spec.label}: {name.rsplit('.', 2)[0]} runs the {impl!r} experts forward, not transformers' grouped_mm or "
                          "batched_mm (which call _apply_gate), so down_proj's input cannot be quantized; load it with "
                          "experts_implementation='grouped_mm' (the default) or use a weight-only config")
            if reason:
                raise ConfigError(reason)
        if any(s.method in BALANCED_METHODS for _, (_, s) in resolve_linears(model, spec).items()):
            architecture_of(model)


def offloaded_modules(model: torch.nn.Module) -> list[str]:
    """Modules accelerate placed on the CPU or disk beside accelerator ones (``hf_device_map``), or
    whose parameters sit on the ``meta`` device under an accelerate hook (their values live elsewhere)."""
    placed = getattr(model, "hf_device_map", None) or {}
    where = {str(v) for v in placed.values()}
    listed = [n for n, v in placed.items() if str(v) == "disk" or (str(v) == "cpu" and where - {"cpu", "disk"})]
    hooked = [n for n, m in model.named_modules() if getattr(m, "_hf_hook", None) is not None
              and getattr(m._hf_hook, "offload", False) and any(p.is_meta for p in m.parameters(recurse=False))]
    names = list(dict.fromkeys(listed + hooked))
    return [n for n in names if not any(n.startswith(f"{other}.") for other in names)]  # outermost only


def quantized_fraction(model: torch.nn.Module, targets: dict, experts: dict) -> float:
    """Parameters of the decoder's linear and expert weights that ``targets`` / ``experts`` quantize, as a fraction."""
    total = sum(m.weight.numel() for _, m in decoder_linears(model)) + sum(e.numel() for _, e in all_experts(model))
    done = sum(m.weight.numel() for m, _ in targets.values()) + sum(e.numel() for e, _ in experts.values())
    return done / total if total else 0.0


def _ends(model: torch.nn.Module, spec: WeightSpec) -> list[tuple[str, torch.nn.Module]]:
    """Embedding and lm_head modules ``spec`` quantizes (untied first when only one of a tied pair is)."""
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    chosen = [("embeddings", emb)] if spec.quantize_embeddings else []
    if spec.quantize_lm_head and head is not None:
        chosen.append(("lm_head", head))
    return chosen


def model_weight_bytes(model: torch.nn.Module, spec: WeightSpec) -> int:
    """Bytes of all weights as an engine would hold them under ``spec``.

    Quantized linears and expert matrices count their codes, scales and zero points (plus a fp32
    static input scale); every other parameter counts at 16 bits; tied tensors count once. The
    untouched model (the identity spec) counts as it is stored: a GGUF at its file's size (its own
    quantized blocks, ``wkvlab_stored_bytes`` set by the loader), a folder at its tensors' dtype
    (bfloat16: 2 bytes).
    """
    stored = getattr(model, "wkvlab_stored_bytes", None)
    if spec.is_identity and stored:
        return int(stored)
    costs: dict[int, float] = {}
    for _, (module, sub) in resolve_linears(model, spec).items():
        static = 4.0 if sub.activations in ("int8-tensor", "fp8-tensor") else 0.0
        costs[id(module.weight)] = weight_storage_bytes(tuple(module.weight.shape), sub) + static
    for _, (matrix, sub) in resolve_experts(model, spec).items():  # a fused tensor: its experts' costs add up
        key = id(matrix.tensor)
        other = float(matrix.tensor.element_size()) if spec.is_identity else 2.0
        costs[key] = costs.get(key, matrix.tensor.numel() * other) + weight_storage_bytes(matrix.shape, sub) - matrix.numel() * other
    for _, module in _ends(model, spec):
        costs[id(module.weight)] = weight_storage_bytes(tuple(module.weight.shape), spec.for_embeddings())
    seen: set[int] = set()
    total = 0.0
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        total += costs.get(id(param), param.numel() * (param.element_size() if spec.is_identity else 2.0))
    return int(round(total))


def _untie_if_needed(model: torch.nn.Module, spec: WeightSpec, notes: list[str]) -> None:
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is not None and head.weight is emb.weight and spec.quantize_embeddings != spec.quantize_lm_head:
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
        notes.append("tied embeddings were untied so that only one of embeddings / lm_head is quantized; both are counted")


@torch.no_grad()
def _keep_rtn_input(record: dict | None, name: str, module: torch.nn.Linear) -> None:
    """For checkpoint writing: the weight just before round-to-nearest (its grid is recomputed from it)."""
    if record is not None:
        record[name] = {"method": "rtn", "weight": module.weight.detach().clone()}


def _calibrated_steps(model, targets, experts, calibration: CalibrationSet, notes: list[str], record: dict | None = None,
                      progress: BuildProgress | None = None) -> None:
    tokens = calibration.tokens
    layers = decoder_layers(model)
    by_method = {m: {n: s for n, (_, s) in targets.items() if s.method == m} for m in ("smoothquant", "awq", "gptq")}
    # AWQ's scale search and GPTQ's column loop are the slow parts (minutes on 2 cores): one tick per layer of each.
    share = 1.0 / (len(layers) * max(1, bool(by_method["awq"]) + bool(by_method["gptq"])))
    tick = progress or (lambda _d, _f: None)
    if by_method["smoothquant"]:
        smooth_model(model, layers, tokens, {n: s.alpha for n, s in by_method["smoothquant"].items()}, architecture_of(model))
    if by_method["awq"]:
        arch = architecture_of(model)
        calls = capture_layer_inputs(model, tokens)
        hidden, found = calls.hidden[0], set()
        for index, (name, layer) in enumerate(layers):  # layer by layer: one layer's inputs alive at a time
            hidden = awq_layer(layer, name, hidden, calls.kwargs[index], by_method["awq"], arch, found, last=index + 1 == len(layers))
            tick(f"AWQ layer {index + 1}/{len(layers)}", share)
        notes.extend(sorted(found))
        del calls, hidden
    for name, (module, sub) in targets.items():
        if sub.method != "gptq":
            _keep_rtn_input(record, name, module)
            module.weight.data = quantize_weight(module.weight.data, sub)
    _round_experts({n: e for n, e in experts.items() if e[1].method != "gptq"})
    gptq_experts = {n: s for n, (_, s) in experts.items() if s.method == "gptq"}
    if by_method["gptq"] or gptq_experts:
        gptq_layers(model, layers, capture_layer_inputs(model, tokens), {**by_method["gptq"], **gptq_experts}, record,
                    on_layer=lambda index: tick(f"GPTQ layer {index + 1}/{len(layers)}", share), notes=notes)


def _activation_plan(model, targets, calibration: CalibrationSet | None) -> dict[str, ActivationQuant]:
    plan = {}
    static = {n: m for n, (m, s) in targets.items() if s.activations in STATIC_ACTIVATIONS}
    amax = observe_model(model, calibration.tokens, static) if static and calibration is not None else {}
    for name, (_, sub) in targets.items():
        if sub.activations == "none":
            continue
        kind = "llm-int8" if sub.method == "llm-int8" else sub.activations
        value = float(amax[name].abs_max.max()) if name in amax else None
        plan[name] = ActivationQuant(kind=kind, amax=value, threshold=sub.threshold)
    return plan


def _expert_activation_plan(experts: dict) -> dict[str, ActivationQuant]:
    """Per experts module, the quantizer of its input (``<module>``, gate/up's input) and of its gate's
    output (``<module>.gated``, down_proj's input): every expert reads them, so one kind per module."""
    kinds: dict[str, set[str]] = {}
    counts: dict[str, tuple[int, int]] = {}
    for name, (matrix, sub) in experts.items():
        module_name, param, _ = name.rsplit(".", 2)
        key = module_name + GATED if param == "down_proj" else module_name
        kinds.setdefault(key, set()).add(sub.activations)
        done, total = counts.get(key, (0, matrix.tensor.shape[0]))
        counts[key] = (done + 1, total)
    plan = {}
    for key, found in kinds.items():
        if found == {"none"}:
            continue
        if len(found) > 1 or counts[key][0] < counts[key][1]:
            raise ConfigError(f"{key}: its experts would read one input under different activation quantization "
                              f"({', '.join(sorted(found | ({'16-bit'} if counts[key][0] < counts[key][1] else set())))}); "
                              "give every expert of a layer the same activations")
        plan[key] = ActivationQuant(kind=found.pop())
    return plan


def _round_experts(experts: dict) -> None:
    """Round-to-nearest of each expert's matrix, as its own linear."""
    for _, (matrix, sub) in experts.items():
        matrix.set(quantize_weight(matrix.get(), sub))


def _unchanged(targets, experts, original_of) -> bool:
    """Every quantized weight equals the one it replaced (compared on the weight's device, one at a time;
    a fused experts tensor as a whole: its unquantized experts are unchanged anyway)."""
    names = [(f"{name}.weight", module.weight) for name, (module, _) in targets.items()]
    names += list({f"{name.rsplit('.', 1)[0]}": m.tensor for name, (m, _) in experts.items()}.items())
    for name, tensor in names:
        original = original_of(name)
        if original is None or not torch.equal(original.to(tensor.device), tensor.data):
            return False
    return True


@torch.no_grad()
def build_quantized(model: torch.nn.Module, spec: WeightSpec, calibration: CalibrationSet | None = None,
                    *, in_place: bool = False, originals=None, record: dict | None = None,
                    progress: BuildProgress | None = None) -> QuantizedWeights:
    """Quantize a deep copy of ``model`` (or ``model`` itself with ``in_place``; no disk cache).

    ``originals`` (in place): the :class:`~wkvlab.weights.restore.WeightSnapshot` taken before, by
    which the lossless check compares; without it an in-place build is not checked. ``record`` (a
    dict) receives, per quantized linear, what a checkpoint writer needs to recover its grid
    exactly (:mod:`wkvlab.weights.checkpoints.export`).
    """
    notes: list[str] = []
    check_quantizable(model, [spec])
    quantized = model if in_place else copy.deepcopy(model)
    _untie_if_needed(quantized, spec, notes)
    targets = resolve_linears(quantized, spec)
    experts = resolve_experts(quantized, spec)
    if experts and record is not None:
        raise ConfigError(f"{spec.label}: writing checkpoints of fused MoE experts is not implemented; evaluate it with wkvlab eval instead")
    if any(s.needs_calibration for _, s in [*targets.values(), *experts.values()]) and calibration is None:
        raise ConfigError(f"{spec.label} needs calibration data; pass --calib prose (or code, math, a file)")
    reference = None if in_place else dict(model.state_dict(keep_vars=True))
    original_of = (lambda name: originals.get(name)) if in_place and originals is not None else \
        (lambda name: reference[name].data if reference is not None and name in reference else None)
    if calibration is not None and any(s.method in ("smoothquant", "awq", "gptq") for _, s in [*targets.values(), *experts.values()]):
        _calibrated_steps(quantized, targets, experts, calibration, notes, record, progress)
    else:
        for name, (module, sub) in targets.items():
            _keep_rtn_input(record, name, module)
            module.weight.data = quantize_weight(module.weight.data, sub)
        _round_experts(experts)
    for _, module in _ends(quantized, spec):
        module.weight.data = quantize_weight(module.weight.data, spec.for_embeddings())
    if _ends(quantized, spec):
        notes.append("embeddings / lm_head quantized with round-to-nearest in the same format; their inputs stay at 16 bits")
    unchanged = _unchanged(targets, experts, original_of)
    plan = {**_activation_plan(quantized, targets, calibration), **_expert_activation_plan(experts)}
    hooks = attach_activation_quantizers(quantized, plan)
    fraction = quantized_fraction(quantized, targets, experts)
    if fraction < 1:
        notes.append(f"{spec.label} quantized {100 * fraction:.1f}% of the decoder's linear and expert weights; the rest stay at "
                     "16 bits (skipped layers, 16-bit overrides)")
    if experts:
        notes.append(f"{spec.label}: {len(experts)} MoE expert matrices quantized, each as its own linear (gate and up of an expert "
                     "as one matrix, as vLLM's fused MoE holds them); routers stay at 16 bits")
    shapes = [tuple(m.weight.shape) for m, s in targets.values() if s.format == "int"] + [m.shape for m, s in experts.values() if s.format == "int"]
    ragged = ragged_group_note(shapes, spec)
    if ragged:
        notes.append(ragged)
    if any(s.method == "llm-int8" for _, s in targets.values()):
        notes.append("llm-int8: outlier columns' activations stay at 16 bits; their weights come from the int8 rows, as bitsandbytes' inference path reconstructs them")
    if unchanged and (targets or experts) and not plan:
        notes.append(
            f"{spec.label} is lossless on this model: every linear weight already lies on its grid "
            "(the checkpoint was dequantized from this format), so its KLD is 0 by construction"
        )
    return QuantizedWeights(spec, quantized, model_weight_bytes(quantized, spec), lossless=unchanged, notes=notes,
                            activations=plan, calibration=calibration.key if calibration is not None and spec.needs_calibration else None,
                            hooks=hooks, quantized_fraction=fraction)


@torch.no_grad()
def quantize_model_weights(model: torch.nn.Module, spec: WeightSpec, calibration: CalibrationSet | None = None,
                           *, model_key: str | None = None, in_place: bool = False, originals=None, tokenizer=None,
                           progress: BuildProgress | None = None) -> QuantizedWeights:
    """Return a quantized copy of ``model`` (the identity spec returns the model itself).

    ``checkpoint:<path>`` specs load the checkpoint instead (:mod:`wkvlab.weights.checkpoints`;
    ``tokenizer``, the reference's, is compared with the checkpoint's).

    With ``model_key`` (the model's fingerprint), configs that read calibration data are cached on
    disk by (model, spec, calibration) and reloaded bit-identically (:mod:`wkvlab.weights.cache`).
    ``in_place``: quantize ``model`` itself; ``originals`` (its
    :class:`~wkvlab.weights.restore.WeightSnapshot`) lets the disk cache store and apply the
    changed tensors in place too. ``progress`` hears of each layer of a calibrated method
    (fractions of this build summing to at most 1).
    """
    if spec.is_identity:
        return QuantizedWeights(spec, model, model_weight_bytes(model, spec), lossless=True, quantized_fraction=0.0)
    if spec.is_checkpoint:
        from wkvlab.weights.checkpoints import load_checkpoint

        return load_checkpoint(model, spec, tokenizer)
    build = functools.partial(build_quantized, progress=progress, in_place=in_place, originals=originals)
    if model_key is None or not spec.needs_calibration or calibration is None or (in_place and originals is None) \
            or not weight_cache_enabled():
        return build(model, spec, calibration)
    from wkvlab.weights.cache import cached_quantize

    return cached_quantize(model, spec, calibration, model_key, build, originals=originals if in_place else None)


def quantize_with_progress(model: torch.nn.Module, spec: WeightSpec, calibration: CalibrationSet | None,
                           model_key: str | None, tick: Callable[[str, float], None], *, in_place: bool = False,
                           originals=None, tokenizer=None) -> QuantizedWeights:
    """:func:`quantize_model_weights` as exactly one progress step: per-layer fractions while a
    calibrated method runs, the rest when the copy is ready (all of it when cached or plain RTN)."""
    done, start, first = [0.0], time.monotonic(), []

    def layer(description: str, fraction: float) -> None:
        # The grid's ETA averages over steps of very different cost (a GPTQ build is worth dozens of
        # window passes); this step's own rate says when the build itself ends. Its first layer also
        # gathers the calibration inputs: projected from it, a 9-minute GPTQ build read "51:51 left"
        # (issue 42), so the rate comes from the layers after it.
        done[0] += fraction
        spent = time.monotonic() - start
        if not first:
            first.append((done[0], spent))
            tick(f"quantizing {spec.label}: {description}, estimating the time left in this step", fraction)
            return
        (first_done, first_spent), left = first[0], 0.0
        if done[0] > first_done:
            left = (spent - first_spent) / (done[0] - first_done) * max(0.0, 1.0 - done[0])
        tick(f"quantizing {spec.label}: {description}, about {int(left // 60)}:{int(left % 60):02d} left in this step", fraction)

    built = quantize_model_weights(model, spec, calibration, model_key=model_key, progress=layer, in_place=in_place,
                                   originals=originals, tokenizer=tokenizer)
    tick(f"quantized weights {spec.label}", max(0.0, 1.0 - done[0]))
    return built
