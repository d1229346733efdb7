"""Launch lines that run: the model argument the user gave, flags of the targeted engine version.

The model argument is ``--model-id`` when given, else the checkpoint ``--model`` named (a local
folder, the Hub id of a built-in name or of a packaged GGUF, or the GGUF file itself for
llama.cpp). A weight format that needs a pre-quantized checkpoint says so and asks for
``--model-id``; a GGUF of another type comes with the commands that make it
(``convert_hf_to_gguf.py``, ``llama-quantize``). Every line names the engine version whose source
its flags were checked against (``data/engines.yaml``).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from wkvlab.errors import ConfigError
from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.engines import COMMAND_ENGINES, Support, engine_version, matrix
from wkvlab.plan.memory import EngineSettings
from wkvlab.plan.parallel import Parallel
from wkvlab.plan.source import ModelSource
from wkvlab.plan.weights import is_gguf
from wkvlab.weights.spec import WeightSpec


@dataclass(frozen=True)
class LaunchCommand(JsonMixin):
    engine: str
    version: str  # the engine version the flags were checked against
    checked: str  # the source files (and commits) behind that
    argv: tuple[str, ...]
    env: tuple[str, ...] = ()
    prepare: tuple[str, ...] = ()  # commands that make the checkpoint first (GGUF conversion)
    model: str = ""  # the model argument
    ready: bool = True  # False: the model argument still needs --model-id (see notes)
    exact: bool = True  # False: a per-layer KV plan approximated by the engine's closest line
    notes: tuple[str, ...] = ()

    def text(self) -> str:
        return " ".join([*self.env, shlex.join(self.argv)])


def _stem(source: ModelSource, model_id: str | None) -> str:
    for text in (model_id, source.folder, source.hub_id, source.gguf, source.given):
        if text:
            name = Path(text.rstrip("/")).name
            return name[:-5] if name.lower().endswith(".gguf") else name
    return "model"


def _served_model(source: ModelSource, model_id: str | None, support: Support, engine: str) -> tuple[str, bool, list[str]]:
    """vLLM/SGLang: (model argument, ready, notes)."""
    display = matrix()[engine]["display"]
    target = model_id or source.served
    notes: list[str] = []
    if not target:
        return "<checkpoint>", False, [source.note or f"{display} needs a checkpoint: pass --model-id <Hub id or folder>"]
    if source.kind == "packaged" and not model_id:
        notes.append(f"{source.given} is the GGUF {Path(source.gguf).name}; {display} loads the Hub checkpoint it was made from, "
                     f"{target} (16-bit weights: plans and measurements of '{source.given}' refer to the GGUF's dequantized weights)")
    if source.kind == "config" and source.note:
        notes.append(source.note)
    if support.checkpoint and not model_id:
        notes.append(f"{target} must be {support.checkpoint}: pass that checkpoint's Hub id or folder with --model-id "
                     f"({display} refuses --quantization {support.weight_arg} on 16-bit weights)")
        return target, False, notes
    return target, True, notes


def _gguf_model(source: ModelSource, model_id: str | None, spec: WeightSpec) -> tuple[str, tuple[str, ...], bool, list[str]]:
    """llama.cpp: (GGUF path, commands that make it, ready, notes)."""
    wanted = spec.format  # a GGUF block type, or bf16/fp16 for a 16-bit file
    gguf_type = wanted.upper()
    if model_id and model_id.lower().endswith(".gguf"):
        return model_id, (), True, []
    if source.gguf and source.gguf_type == wanted:
        return source.gguf, (), True, []
    name = _stem(source, model_id)
    out = f"./{name}-{gguf_type}.gguf"
    if source.gguf and not (model_id or source.folder or source.hub_id):
        if is_gguf(spec) and source.quantized_file and spec.bits >= source.file_bits:
            return out, (), False, [f"{gguf_type} from {Path(source.gguf).name} would re-quantize its {source.gguf_type_name} weights up: "
                                    "no more faithful than the file (its rounding stays in it) and larger — serve the file as it is, "
                                    "or quantize the 16-bit checkpoint (--model-id)"]
        if not is_gguf(spec):
            return out, (), False, [f"{source.gguf} is already quantized ({source.gguf_type or 'another type'}); a {gguf_type} "
                                    "GGUF needs the 16-bit checkpoint: pass its folder or Hub id with --model-id"]
        return out, (f"llama-quantize --allow-requantize {shlex.quote(source.gguf)} {out} {gguf_type}",), True, [
            f"requantizing {Path(source.gguf).name} ({source.gguf_type or 'quantized'}) rounds twice (the file's rounding, then the new type's); "
            "quantize from the 16-bit checkpoint when you have it (--model-id)"]
    folder = model_id or source.folder
    prepare: list[str] = []
    if not folder:
        if not source.hub_id:
            return out, (), False, [source.note or "llama.cpp needs a GGUF: pass --model-id <file.gguf, folder or Hub id>"]
        folder = f"./{name}"
        prepare.append(f"huggingface-cli download {source.hub_id} --local-dir {folder}")
    first = f"./{name}-BF16.gguf" if is_gguf(spec) else out
    prepare.append(f"python convert_hf_to_gguf.py {shlex.quote(folder)} --outtype {'bf16' if is_gguf(spec) else wanted} --outfile {first}")
    if is_gguf(spec):
        prepare.append(f"llama-quantize {first} {out} {gguf_type}")
    return out, tuple(prepare), True, []


def launch_command(engine: str, source: ModelSource, weights: WeightSpec, support: Support, batch: int, ctx: int,
                   par: Parallel = Parallel(), settings: EngineSettings = EngineSettings(), model_id: str | None = None) -> LaunchCommand:
    """The launch line; raises ConfigError rather than print one the engine rejects."""
    if not support.accepted or support.kv is None:
        reason = support.reasons[0] if support.reasons else "not supported"
        raise ConfigError(f"{engine} rejects {weights.label}: {reason}")
    if engine not in COMMAND_ENGINES:
        raise ConfigError(f"no launch line for {engine}; the planner writes them for " + ", ".join(COMMAND_ENGINES))
    _, facts = engine_version(engine, support.version)
    kv = support.kv
    notes = [n for n in support.notes if "checkpoint" in n or "version" in n or "scales" in n or "plan" in n or "llama.cpp" in n]
    env = tuple(support.weight_env) + kv.env
    if engine == "llama.cpp":
        model, prepare, ready, extra = _gguf_model(source, model_id, weights)
        argv = ["llama-server", "-m", model, "-ngl", "999", "-c", str(batch * ctx), "-np", str(batch)]
        if kv.args:
            argv += ["-fa", "on", *kv.args]
        if par.gpus > 1:
            argv += ["-sm", par.split, "-ts", ",".join("1" * par.gpus)] + (["-mg", "0"] if par.split == "row" else [])
        extra.append(f"-c is the total context of the {batch} slots (-np): each gets {ctx} tokens")
        return LaunchCommand(engine, facts["label"], facts["checked"], tuple(argv), env, prepare, model, ready, kv.exact, tuple(notes + extra))
    model, ready, extra = _served_model(source, model_id, support, engine)
    flags = matrix()[engine]["parallel"]
    quant = ["--quantization", support.weight_arg] if support.weight_arg else []
    parallel = ([flags["tp"], str(par.tp)] if par.tp > 1 else []) + ([flags["pp"], str(par.pp)] if par.pp > 1 else [])
    if engine == "vllm":
        argv = ["vllm", "serve", model, *quant, *kv.args, *parallel, "--max-model-len", str(ctx), "--max-num-seqs", str(batch),
                "--gpu-memory-utilization", f"{settings.vllm_gpu_memory_utilization:.2f}"]
    else:
        argv = ["python", "-m", "sglang.launch_server", "--model-path", model, *quant, *kv.args, *parallel,
                "--context-length", str(ctx), "--max-running-requests", str(batch),
                "--mem-fraction-static", f"{settings.sglang_mem_fraction_static:.2f}"]
    return LaunchCommand(engine, facts["label"], facts["checked"], tuple(argv), env, (), model, ready, kv.exact, tuple(notes + extra))
