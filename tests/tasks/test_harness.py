"""The lm-eval model 'wkvlab' against independent computations on the packaged default model.

The local task (tests/tasks/lmeval: eight four-way questions read from JSONL by the task's own
utils.py) runs offline. What lm-eval reports must be what the model computes outside lm-eval:
the log-likelihood of each choice, summed over the choice's tokens, and the accuracy from them.
"""
import os

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-eval is not installed; pip install 'wkvlab[tasks]'")

from wkvlab.errors import ConfigError  # noqa: E402
from wkvlab.kv.hook import kv_quantization  # noqa: E402
from wkvlab.kv.spec import KVSpec  # noqa: E402
from wkvlab.tasks.harness import WkvlabLM  # noqa: E402
from wkvlab.tasks.simulation import SimulatedModel  # noqa: E402
from wkvlab.weights.apply import quantize_model_weights  # noqa: E402
from wkvlab.weights.spec import WeightSpec  # noqa: E402

TASKS = os.path.join(os.path.dirname(__file__), "lmeval")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _offline_one_thread(one_torch_thread):
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    yield


@pytest.fixture(scope="module")
def facts():
    import json

    with open(os.path.join(TASKS, "facts.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _direct_loglikelihood(model, tokenizer, context: str, continuation: str, kv: KVSpec | None = None) -> float:
    """log p(continuation | context) straight from the model's logits (tokenized whole, then split)."""
    ctx = tokenizer(context, add_special_tokens=False).input_ids
    whole = tokenizer(context + continuation, add_special_tokens=False).input_ids
    ids = torch.tensor([whole])
    with torch.no_grad():
        if kv is None:
            logits = model(input_ids=ids, use_cache=False).logits[0]
        else:
            with kv_quantization(model, kv):
                logits = model(input_ids=ids, use_cache=False).logits[0]
    lp = torch.log_softmax(logits.float(), -1)
    return float(sum(lp[i - 1, whole[i]] for i in range(len(ctx), len(whole))))


def test_simple_evaluate_by_name_matches_the_model_outside_lm_eval(default_model, facts):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    out = simple_evaluate(model="wkvlab", model_args="model=default,weights=none,kv=fp16", tasks=["wkvlab_facts"],
                          task_manager=TaskManager(include_path=TASKS), log_samples=True, bootstrap_iters=0)
    assert out["config"]["model_name"] == "smollm2" and out["config"]["weights"] == "none"
    samples = out["samples"]["wkvlab_facts"]
    hits = []
    for sample in samples:
        doc = sample["doc"]
        direct = [_direct_loglikelihood(default_model.model, default_model.tokenizer, doc["question"], c) for c in doc["choices"]]
        got = [float(r[0][0]) for r in sample["resps"]]
        assert got == pytest.approx(direct, abs=1e-4)
        hits.append(max(range(len(direct)), key=direct.__getitem__) == doc["answer"])
    assert out["results"]["wkvlab_facts"]["acc,none"] == pytest.approx(sum(hits) / len(hits))
    assert len(samples) == len(facts)


def test_quantized_configs_score_through_the_same_simulation(default_model, facts):
    wspec, kspec = WeightSpec.parse("int4-g128"), KVSpec.parse("q4_0")
    sim = SimulatedModel.build(default_model, wspec, kspec)
    lm = WkvlabLM.of(sim)
    doc = facts[0]

    class Request:  # what lm-eval hands an LM: .args
        def __init__(self, *args):
            self.args = args

    got = [score for score, _ in lm.loglikelihood([Request(doc["question"], c) for c in doc["choices"]], disable_tqdm=True)]
    built = quantize_model_weights(default_model.model, wspec)
    direct = [_direct_loglikelihood(built.model, default_model.tokenizer, doc["question"], c, kspec) for c in doc["choices"]]
    assert got == pytest.approx(direct, abs=1e-4)
    plain = [_direct_loglikelihood(default_model.model, default_model.tokenizer, doc["question"], c) for c in doc["choices"]]
    assert max(abs(a - b) for a, b in zip(got, plain)) > 1e-2  # the configs really change the scores

    # rolling log-likelihood = the sum over the text's tokens after the prefix token
    text = "The sun rises in the east and sets in the west."
    rolling = lm.loglikelihood_rolling([Request(text)], disable_tqdm=True)[0]
    ids = [lm.prefix_token_id] + default_model.tokenizer(text, add_special_tokens=False).input_ids
    lp = sim.logprobs(ids[:-1])
    assert rolling == pytest.approx(float(sum(lp[i, ids[i + 1]] for i in range(len(ids) - 1))), abs=1e-4)

    # greedy generation stops before the stop string and agrees with the teacher-forced argmax
    prompt = "The capital of France is"
    text = lm.generate_until([Request(prompt, {"until": ["."], "max_gen_toks": 4, "do_sample": False})], disable_tqdm=True)[0]
    first = int(sim.logprobs(sim.encode(prompt))[-1].argmax())
    assert text.startswith(default_model.tokenizer.decode([first])) and "." not in text
    with pytest.raises(ConfigError, match="decodes greedily"):
        lm.generate_until([Request(prompt, {"until": ["."], "do_sample": True, "temperature": 0.7})], disable_tqdm=True)


def test_bad_model_args_are_one_line_errors(default_model):
    with pytest.raises(ConfigError, match=r"unknown wkvlab model_args \['pretrained'\]"):
        WkvlabLM(model=default_model, pretrained="gpt2")
    with pytest.raises(ConfigError, match="runs on the CPU"):
        WkvlabLM(model=default_model, device="mps")
    with pytest.raises(ConfigError, match="unknown KV format"):
        WkvlabLM(model=default_model, kv="int9")
