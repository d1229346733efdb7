"""The lm-evaluation-harness model ``wkvlab``: any weights × KV config of the simulation as an lm-eval ``LM``.

    >>> import wkvlab.tasks.harness  # registers the name "wkvlab" with lm-eval
    >>> from lm_eval import simple_evaluate
    >>> simple_evaluate(model="wkvlab", model_args="model=default,weights=int4-g128,kv=q4_0", tasks=["arc_easy"])

``model_args``: ``model`` (``default``, ``gemma3-270m``, a .gguf, an HF folder), ``weights`` and ``kv``
in the grammar of ``wkvlab eval --weights/--kv`` (one config each), ``calib``/``calib_samples``/
``calib_len`` for calibrated methods. lm-eval splits ``model_args`` strings at commas, so a KV spec
with commas (``int4+skip=0,1``) must go in a dict: ``model_args={"kv": "int4+skip=0,1"}``.

lm-eval (0.4.13) finds models only in its own registry, filled by ``@register_model`` when the
defining module is imported (``lm_eval/api/registry.py``; no entry-point discovery), so importing
this module is what makes ``model="wkvlab"`` work — ``wkvlab.tasks.lm_eval_cli`` does it for lm-eval's
command line. ``get_model`` loads lm-eval's own models lazily only while its registry is empty;
importing ``lm_eval.models`` first keeps ``hf``, ``vllm`` etc. available next to ours.
"""
from __future__ import annotations

from typing import Any

from tqdm import tqdm

from wkvlab.errors import ConfigError
from wkvlab.models.loading import LoadedModel
from wkvlab.tasks.simulation import SimulatedModel
from wkvlab.weights.calibration import CalibrationSpec

try:
    import lm_eval.models  # noqa: F401 - registers lm-eval's own models before ours (see above)
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError:  # pragma: no cover - the message is the test
    raise ConfigError("downstream tasks need lm-evaluation-harness: pip install 'wkvlab[tasks]' (lm-eval==0.4.13)") from None

def _runs_on_cpu(device: str | None) -> bool:
    """CPU, or lm-eval's command-line default ``cuda:0`` on a machine without CUDA (what its ``hf`` model falls back to)."""
    if device in (None, "cpu"):
        return True
    import torch

    return str(device).startswith("cuda") and not torch.cuda.is_available()


MODEL_ARGS = ("model", "weights", "kv", "calib", "calib_samples", "calib_len")


@register_model("wkvlab")
class WkvlabLM(TemplateLM):
    """lm-eval's view of a :class:`SimulatedModel`: log-likelihoods and greedy generation, one sequence at a time."""

    def __init__(self, model: str | LoadedModel = "default", weights: str = "none", kv: str = "fp16", calib: str = "prose",
                 calib_samples: int = 16, calib_len: int = 512, batch_size: Any = 1, max_batch_size: Any = None,
                 device: str | None = None, simulation: SimulatedModel | None = None, **unknown: Any):
        super().__init__()
        if unknown:
            raise ConfigError(f"unknown wkvlab model_args {sorted(unknown)}; use {', '.join(MODEL_ARGS)}")
        if not _runs_on_cpu(device):
            raise ConfigError(f"the wkvlab lm-eval model runs on the CPU; pass --device cpu (got {device})")
        # batch_size is accepted and ignored: sequences run alone so padding cannot touch KV groups.
        self.sim = simulation or SimulatedModel.build(model if isinstance(model, LoadedModel) else str(model), str(weights), str(kv),
                                                      CalibrationSpec(str(calib), int(calib_samples), int(calib_len)))
        self.tokenizer = self.sim.loaded.tokenizer

    @classmethod
    def of(cls, simulation: SimulatedModel) -> "WkvlabLM":
        """Wrap an already built simulation (``wkvlab tasks`` quantizes each weight config once)."""
        return cls(simulation=simulation)

    # ---- what TemplateLM needs ---------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.sim.eot_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return int(bos) if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self.sim.max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.sim.encode(string, bos=add_special_tokens is not False)

    def tok_decode(self, tokens: list[int], **kwargs) -> str:
        return self.tokenizer.decode(tokens)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        out = []
        for request, context, continuation in tqdm(requests, desc="wkvlab loglikelihood", disable=disable_tqdm):
            result = self.sim.score(list(context), list(continuation))
            out.append(result)
            if request is not None:
                self.cache_hook.add_partial("loglikelihood", request, result)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        totals = []
        for (text,) in tqdm([r.args for r in requests], desc="wkvlab loglikelihood_rolling", disable=disable_tqdm):
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(text, add_special_tokens=False), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            total = sum(score for score, _ in self._loglikelihood_tokens([(None, c, t) for c, t in windows], disable_tqdm=True))
            totals.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for context, gen_kwargs in tqdm([r.args for r in requests], desc="wkvlab generate_until", disable=disable_tqdm):
            kwargs = dict(gen_kwargs or {})
            if kwargs.get("do_sample") or float(kwargs.get("temperature", 0.0) or 0.0) > 0:
                raise ConfigError("the wkvlab lm-eval model decodes greedily; run the task with do_sample=false, temperature=0")
            until = kwargs.get("until") or []
            stop = [until] if isinstance(until, str) else list(until)
            text = self.sim.generate(self.tok_encode(context), max_new_tokens=int(kwargs.get("max_gen_toks", 256)), stop=stop)
            out.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return out

    def get_model_info(self) -> dict:
        return {"model_name": self.sim.loaded.name, "model_sha256": self.sim.loaded.fingerprint,
                "weights": self.sim.built.spec.label, "kv": self.sim.kv.label}
