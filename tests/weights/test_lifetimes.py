"""What a build or a grid must not keep alive (issue #40): a capture sample pinning a whole input,
a KV cache or its hidden states past their use, a host copy of every tensor before saving."""
import torch

from tests.conftest import tiny_llama
from wkvlab.weights.capture import InputStats


def test_kept_input_samples_are_copies_not_views_of_the_whole_input():
    x = torch.randn(64, 32, 16)
    stats = InputStats()
    stats.add(x, keep_every=128)
    (sample,) = stats.samples
    assert sample.shape == (16, 16) and torch.equal(sample, x.reshape(-1, 16)[::128])
    # a view of rows[::128] would keep all 64 x 32 x 16 floats alive
    assert sample.untyped_storage().nbytes() == 16 * 16 * 4


def test_a_chunked_cache_keeps_no_hidden_states_after_its_chunk(one_torch_thread):
    from wkvlab.eval.chunks import WindowPass
    from wkvlab.kv import KVSpec
    from wkvlab.kv.hook import layer_stores

    model = tiny_llama()
    spec = KVSpec.parse("int4+residual=8")  # keeps full-precision copies: the hook reads each layer's inputs
    window = WindowPass(model, spec, layer_stores(model, spec))
    window.step(torch.arange(16))
    assert window.cache.layers[0].inputs == {}  # the dict the cache layers share: residuals and hidden states dropped


def test_a_finished_batch_drops_its_caches_before_the_next_weight_config(monkeypatch, one_torch_thread):
    from wkvlab.data.windows import make_windows
    from wkvlab.eval import runner
    from wkvlab.kv import KVSpec
    from wkvlab.weights import WeightSpec

    model = tiny_llama()
    seen = []
    run_cells = runner._run_cells

    def spy(grid, cells, reference):
        alive = [c for batch in seen for c in batch if c.pass_.cache is not None]
        assert not alive, f"{len(alive)} cache(s) of earlier batches still alive"
        run_cells(grid, cells, reference)
        seen.append(cells)

    monkeypatch.setattr(runner, "_run_cells", spy)
    windows = make_windows(torch.randint(0, 128, (80,), generator=torch.Generator().manual_seed(0)), ctx=32, n_tokens=64, bos_id=None)
    runner.run_grid(model, windows, [WeightSpec.parse("none"), WeightSpec.parse("int8")], [KVSpec.parse("fp16"), KVSpec.parse("q8_0")],
                    model_name="tiny", data_name="random", options=runner.RunOptions(chunk=16, plan="one-model", interleave=1))
    assert len(seen) == 4 and all(c.pass_.cache is None for batch in seen for c in batch)


def test_safetensors_written_one_tensor_at_a_time_read_back_exactly(tmp_path):
    from safetensors.torch import load_file

    from wkvlab.tensorfile import write_state

    tensors = {"w": torch.randn(3, 5).bfloat16(), "ids": torch.arange(7), "scalar": torch.tensor(2.5),
               "mask": torch.tensor([True, False]), "transposed": torch.randn(4, 6).T}
    write_state(tmp_path / "t.safetensors", tensors.items(), {"format": "pt"})
    back = load_file(str(tmp_path / "t.safetensors"))
    assert list(back) == list(tensors) and all(torch.equal(back[k], v) for k, v in tensors.items())
