"""Everything ``--weights`` and ``--kv`` accept, as ``wkvlab presets`` lists it.

The grammars themselves live in :mod:`wkvlab.weights.parse` and :mod:`wkvlab.kv.spec`; this module
only names what they accept, with an example each. Every example is parsed when the listing is
built, so an example that stops parsing breaks ``wkvlab presets`` and its test (which also checks
that each name the README mentions appears here).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Form:
    """One accepted form: its pattern, a concrete example, and what it means."""

    pattern: str
    example: str
    meaning: str


# Weight names that are not presets but are what most runs use (parse.py's _base); each example is
# shown with the spec it parses to.
WEIGHT_NAMES = (
    Form("none", "none", "the checkpoint in float32: the reference itself (aliases fp32, ref)"),
    Form("bf16", "bf16", "linear weights rounded to bfloat16 (what 16-bit serving costs)"),
    Form("fp16", "fp16", "linear weights rounded to float16"),
    Form("int8", "int8", "round-to-nearest INT8, symmetric, one scale per output row"),
    Form("int4", "int4", "round-to-nearest INT4, asymmetric, one scale + zero per row"),
    Form("int4-g128", "int4-g128", "round-to-nearest INT4 in groups of 128 inputs (GPTQ/AWQ checkpoints' grouping)"),
)

WEIGHT_GRAMMAR = (
    Form("int<b>[-g<G>][-sym|-asym][-fmin]", "int3-g64-sym", "round-to-nearest, 2-8 bits, groups of G (default: per row); -fmin: float minimum (GGUF Q4_1 style)"),
    Form("rtn-|gptq-|awq-int<b>[-g<G>]...", "gptq-int3-g64", "the same grid, chosen by RTN, GPTQ or AWQ (calibrated: --calib)"),
    Form("<file>.json | <file>.yaml", "spec.yaml", "a WeightSpec written as a mapping (docs/weights.md)"),
    Form("q8_0 | q4_0 | q4_1 | q5_0 | q5_1", "q4_0", "llama.cpp block types as weight formats (bit-exact with gguf.quants)"),
    Form("checkpoint:<folder|file.gguf>", "checkpoint:smollm2-w4a16", "a quantized checkpoint as it is: compressed-tensors, GPTQ, AWQ or GGUF ('wkvlab export' writes one)"),
)

WEIGHT_OPTIONS = (
    # ';' is read as the same separator (specs written before the grammars shared '+')
    Form("+a=<act>", "int8+a=int8", "activations: none, int8 (per token), int8-tensor, fp8, fp8-tensor, nvfp4, mxfp4"),
    Form("+wo", "fp8+wo", "weight-only execution: activations stay 16-bit"),
    Form("+wscale=tensor", "int8+wscale=tensor", "one weight scale per matrix"),
    Form("+skip=<i,j,a-b>", "int4-g128+skip=0,1", "decoder layers kept at 16 bits"),
    Form("+skip-first=N +skip-last=N +skip-re=<regex>", "int4+skip-first=1", "more ways to keep layers or modules at 16 bits"),
    Form("+emb +head", "int8+head", "also quantize the embeddings / lm_head"),
    Form("+override=<regex>:<config>", "nvfp4+override=self_attn:fp8", "another config for matching modules"),
    Form("+damp= +block= +actorder +alpha= +grid= +noclip +threshold=", "gptq-int4-g128+actorder", "method parameters (GPTQ, AWQ, SmoothQuant, LLM.int8())"),
    Form("+grid-from=original", "gptq-int4-g128+grid-from=original", "GPTQ as llm-compressor runs it: group grids from the weights before the column loop (default updated: IST-DASLab)"),
)

KV_GRAMMAR = (
    Form("<format>", "q8_0", "one element format for K and V (table above); aliases none/f16/auto = fp16, fp8 = fp8_e4m3"),
    Form("<K format>/<V format>", "q8_0/q4_0", "different formats for keys and values"),
    Form("int<b>[-g<G>][-sym|-asym]", "int4-g32", "INT2-8 per token and head, in groups of G along head_dim"),
    Form("int<b>-c<G>[-sym|-asym]", "int2-c32", "per channel over groups of G tokens (KIVI's keys)"),
    Form("K<b>V<b> | KV<b>", "K8V4", "KVTuner's bit pairs (8/4/2 bits: int8/int4/int2; 16: the model's precision)"),
    Form("<engine>@<release>:<dtype>", "vllm@0.23:int8_per_token_head",
         "a vLLM, SGLang or llama.cpp preset as that release stores it (the engine releases table); without @: the newest modelled"),
    Form("hqq<b>[-g<G>]", "hqq4+residual=128", "HQQ (1/2/3/4/8 bits) on the whole cache, re-quantized at each flush: needs residual=R (hf-hqq:int<b>)"),
    Form("quanto<b>", "quanto4+residual=128", "optimum-quanto qint2/qint4 in groups of 64, computed in the cache's dtype (hf-quanto:int<b>)"),
    Form("nuq<b>[-c]", "kvquant:3", "KVQuant non-uniform codebooks (calibrated), through the kvquant:<b> presets"),
    Form("@<file>.yaml | @<file>.json", "@plan.yaml", "a KVSpec file, e.g. written by 'wkvlab search --out'"),
)

KV_OPTIONS = (
    Form("+rot | +rot=<block> | +rot=full | +norot", "q4_0+rot", "Hadamard rotation of Q/K/V along head_dim (llama.cpp's rule by default)"),
    Form("+sinks=<N>", "int4+sinks=4", "the first N positions kept at model precision"),
    Form("+sinks=auto | +sinkratio=<t>", "int4+sinks=auto", "KVSink: outlier tokens kept at model precision (calibrated)"),
    Form("+residual=<R>", "int2+residual=128", "KIVI-style flush: full-precision tokens quantized all at once when R have piled up (from position 0)"),
    Form("+prefill=<L>", "hf-quanto:int4+prefill=512", "with residual: transformers' QuantizedCache after an L-token prompt (the prompt attends unquantized)"),
    Form("+window=<W>", "int4+window=128", "SKVQ: the W most recent tokens of every query at model precision"),
    Form("+k_residual=<R> +k_window=<W> +v_residual=<R> +v_window=<W>", "int4+k_residual=128+v_window=129",
         "the same for one side only (KIVI: keys flushed every 128, values in a sliding window of 129)"),
    Form("+pastonly", "int4+pastonly", "WKVQuant: the token being decoded attends to its own K/V at model precision"),
    Form("+skip=<i,j,...|sliding_window>", "int4+skip=0,1,sliding_window", "layers kept at model precision"),
    Form("+<layers>=<K>[/<V>]", "int4+0-3,76-79=int8", "these decoder layers with their own formats (a per-layer map)"),
    Form("+q=<fp8_e4m3|q8_0>", "q8_0+q=q8_0", "queries quantized too, where K is"),
    Form("+prerope", "int4+prerope", "keys quantized before RoPE"),
    Form("+smooth[=a]", "int4+smooth", "QServe's SmoothAttention (calibrated)"),
    Form("+scales=amax448|amax448-head|calculate", "fp8_e4m3+scales=amax448",
         "calibrated FP8 scales instead of 1.0: amax/448 per layer or per head (llm-compressor checkpoints), vLLM's --calculate-kv-scales rule"),
    Form("+outliers=<f>", "kvquant:3+outliers=0.02", "a fraction of values kept in fp16 (KVQuant's dense-and-sparse)"),
    Form("+recipe=<mxfp4|blockfp4|nvfp4|nvfp4-sm100>", "sglang:fp4_e2m1+recipe=nvfp4",
         "SGLang's FP4 recipe for an fp4_e2m1 cache (nvfp4: E4M3 block scales + fp32 k_scale, read exactly in decode; -sm100: k_scale x6 "
         "without checkpoint scales up to SGLang 0.5.20, sglang@0.5.20:; 1.0 from 0.5.21)"),
)

# Presets whose name is a pattern: the example parsed for them.
KV_PRESET_EXAMPLES = {"llamacpp:<k>/<v>": "llamacpp:q8_0/q4_0", "llamacpp-x86:<k>/<v>": "llamacpp-x86:q8_0", "exl3:k<b>v<b>": "exl3:k4v4", "exl3-fa:k<b>v<b>": "exl3-fa:k4v4", "exl3-fa@0.0.28:k<b>v<b>": "exl3-fa@0.0.28:k4v4", "K<b>V<b>": "K8V4", "KV<b>": "KV4"}


def _options(forms: tuple[Form, ...]) -> str:
    """The option names the forms start with: '+a=', '+wo', ... (each once)."""
    names = []
    for form in forms:
        token = form.pattern.split(" ")[0]
        name = re.split(r"[=\[|]", token)[0] + ("=" if re.search(r"(?<!\[)=", token) else "")
        names.append(name)
    return " ".join(dict.fromkeys(names))


def weights_help(preset_names: tuple[str, ...]) -> str:
    """``--weights``' help, built from the listing above and the presets, so it says what
    ``wkvlab presets`` says (one grammar, one separator: '+')."""
    names = ", ".join(form.pattern for form in WEIGHT_NAMES)
    grammar = ", ".join(form.pattern for form in WEIGHT_GRAMMAR if not form.pattern.startswith("<file>"))
    return (f"weight config(s): {names}, {grammar}; presets {', '.join(preset_names)}; options after '+' "
            f"({_options(WEIGHT_OPTIONS)}), e.g. {WEIGHT_OPTIONS[3].example} (repeat or comma-separate; 'wkvlab presets' lists all)")


def kv_help() -> str:
    """``--kv``' help, built from the listing above (as ``wkvlab presets`` prints it)."""
    grammar = ", ".join(form.pattern for form in KV_GRAMMAR)
    return (f"KV config(s): fp16, fp8_e4m3, int8, int4, int2, q8_0, q4_0, ... ({grammar}), presets (llamacpp:q4_0, vllm:fp8_e4m3, vllm@0.23:int8_per_token_head, "
            f"exl3:k4v4, kivi2, ...), options after '+' ({_options(KV_OPTIONS)}) ('wkvlab presets' lists all)")


def check_examples() -> None:
    """Parse every example (ConfigError if one no longer parses)."""
    from wkvlab.kv.spec import KVSpec
    from wkvlab.weights.spec import WeightSpec

    for form in WEIGHT_NAMES + WEIGHT_GRAMMAR + WEIGHT_OPTIONS:
        if not form.example.endswith((".yaml", ".json")) and not form.example.startswith("checkpoint:"):  # files the docs' commands write
            WeightSpec.parse(form.example)
    for form in KV_GRAMMAR + KV_OPTIONS:
        if not form.example.startswith("@"):
            KVSpec.parse(form.example)
    for example in KV_PRESET_EXAMPLES.values():
        KVSpec.parse(example)


def _pattern_members(pattern: str) -> list[str]:
    """The concrete presets a pattern row stands for (those not listed on rows of their own)."""
    from wkvlab.kv.presets import LLAMACPP_TYPES, preset_names

    own = set(preset_names())
    if pattern == "llamacpp:<k>/<v>":
        members = [f"llamacpp:{k}/{v}" for k in LLAMACPP_TYPES for v in LLAMACPP_TYPES if k != v]
    elif pattern == "llamacpp-x86:<k>/<v>":
        members = [f"llamacpp-x86:{k}/{v}" for k in LLAMACPP_TYPES for v in LLAMACPP_TYPES]
    elif pattern in ("exl3:k<b>v<b>", "exl3-fa:k<b>v<b>", "exl3-fa@0.0.28:k<b>v<b>"):
        members = [f"{pattern.split(':')[0]}:k{k}v{v}" for k in range(2, 9) for v in range(2, 9)]
    elif pattern == "K<b>V<b>":
        members = [f"K{k}V{v}" for k in (16, 8, 4, 2) for v in (16, 8, 4, 2)]
    elif pattern == "KV<b>":
        members = [f"KV{b}" for b in (16, 8, 4, 2)]
    else:
        members = [KV_PRESET_EXAMPLES[pattern]]
    return [m for m in members if m not in own]


def _pattern_label(pattern: str) -> str:
    """The label every member of a pattern row can claim; the exceptions are named."""
    from wkvlab.kv import KVSpec
    from wkvlab.kv.presets import fidelity_of

    by_label: dict[str, list[str]] = {}
    for member in _pattern_members(pattern):
        by_label.setdefault(fidelity_of(KVSpec.parse(member))["label"], []).append(member)
    main = max(by_label, key=lambda label: len(by_label[label]))
    others = "; ".join(f"{label}: {', '.join(names)}" for label, names in by_label.items() if label != main)
    return main + (f" ({others})" if others else "")


def engine_release_rows() -> list[tuple[str, str, str, str, str]]:
    """``(engine, @release, version, commit, what it gates)`` for every release of the engine table
    (:mod:`wkvlab.engine_releases`), the default (the newest modelled) marked."""
    from wkvlab.engine_releases import engine_table, releases

    rows = []
    for engine in engine_table():
        for release in releases(engine):
            stores = "stores " + ", ".join(f"{a} as {b}" for a, b in release.kv_formats) if release.kv_formats else ""
            gates = "; ".join(part for part in (", ".join(release.features), stores) if part)
            rows.append((engine, release.key + (" (default)" if release.is_default else ""), release.label + (f", {release.date}" if release.date else ""),
                         release.commit or "-", gates or "-"))
    return rows


def kv_preset_rows() -> list[tuple[str, str, str, str]]:
    """``(name, spec, fidelity, source)`` for every KV preset ``wkvlab presets`` lists.

    A concrete row shows :func:`~wkvlab.kv.presets.fidelity_of` of that exact spec; a pattern row
    (``llamacpp:<k>/<v>``) shows the label all its members share — the members with evidence of
    their own (a recorded engine check) are rows of their own, so a pattern never borrows one.
    """
    from wkvlab.kv import KVSpec
    from wkvlab.kv.presets import fidelity_of, preset_names

    rows = []
    for name in preset_names():
        example = KV_PRESET_EXAMPLES.get(name)
        spec = KVSpec.parse(example or name)
        if example:
            rows.append((name, f"e.g. {example} = {spec.canonical()}", _pattern_label(name), "any bit widths / pair of the types above"))
            continue
        info = fidelity_of(spec)
        rows.append((name, spec.canonical(), info["label"] + (f" ({info['differs']})" if info.get("differs") else ""), info["source"]))
    return rows
