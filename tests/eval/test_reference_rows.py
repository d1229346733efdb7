"""The recorder's sampled full rows and a window's row selection, now slices of host-known indices
(no boolean mask on the device), against the masks they replaced."""
import torch

from wkvlab.eval.reference import ReferenceRecorder


def test_full_rows_are_every_nth_token_across_chunks_and_windows():
    torch.manual_seed(0)
    chunks = [torch.randn(n, 11) for n in (3, 4, 7, 1, 6)]
    recorder = ReferenceRecorder(k=4, samples=2, full_every=5)
    for i, logits in enumerate(chunks):
        recorder.add(logits, torch.zeros(len(logits), dtype=torch.long), seed=i)
        if i == 2:
            recorder.end_window()
    stored = recorder.finish({})
    every = torch.cat(chunks)
    rows = torch.arange(len(every))
    assert stored.full_rows.tolist() == rows[rows % 5 == 0].tolist() == [0, 5, 10, 15, 20]
    assert torch.equal(stored.full_logprobs, torch.log_softmax(every, -1)[rows % 5 == 0])


def test_a_chunks_rows_take_the_full_rows_inside_it():
    torch.manual_seed(0)
    recorder = ReferenceRecorder(k=4, samples=2, full_every=3)
    recorder.add(torch.randn(20, 11), torch.zeros(20, dtype=torch.long))
    window = recorder.finish({}).chunk(2, 19)  # full rows 3, 6, ..., 18 of the run: 1, 4, ..., 16 of the window
    part = window.rows(4, 11)
    inside = (window.full_rows >= 4) & (window.full_rows < 11)  # what the boolean mask selected
    assert part.full_rows.tolist() == (window.full_rows[inside] - 4).tolist() == [0, 3, 6]
    assert torch.equal(part.full, window.full[inside]) and part.full_rows_host == (0, 3, 6)
    assert window.rows(5, 7).full.shape[0] == 0 and window.rows(16, 17).full_rows.tolist() == [0]
