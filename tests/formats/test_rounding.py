from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.quants import np_roundf

from wkvlab.errors import ConfigError
from wkvlab.formats import round_with

# Values where the two modes, or naive implementations, disagree.
TRICKY = [0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, -0.49999997, 1.4999999, 2.0**23 + 1, -(2.0**23 + 1), 0.0, -0.3, 7.5]


def test_half_even_is_torch_round() -> None:
    x = torch.tensor(TRICKY)
    assert torch.equal(round_with(x, "half_even"), torch.round(x))
    assert round_with(torch.tensor([0.5, 1.5, 2.5, -2.5]), "half_even").tolist() == [0.0, 2.0, 2.0, -2.0]


def test_half_away_matches_ggml_roundf() -> None:
    x = torch.tensor(TRICKY)
    assert round_with(torch.tensor([0.5, 1.5, 2.5, -2.5]), "half_away").tolist() == [1.0, 2.0, 3.0, -3.0]
    assert round_with(torch.tensor([0.49999997, 2.0**23 + 1]), "half_away").tolist() == [0.0, 2.0**23 + 1]
    torch.manual_seed(0)
    rnd = torch.cat([x, torch.randn(10000) * 50, torch.randint(-300, 300, (5000,)).float() / 2])
    assert np.array_equal(round_with(rnd, "half_away").numpy(), np_roundf(rnd.numpy()))


def test_nonfinite_pass_through_and_no_mutation() -> None:
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 2.5])
    before = x.clone()
    for mode in ("half_even", "half_away"):
        y = round_with(x, mode)
        assert y[0] == float("inf") and y[1] == -float("inf") and torch.isnan(y[2])
    assert torch.equal(x[:2], before[:2]) and torch.isnan(x[2]) and x[3] == 2.5


def test_unknown_mode() -> None:
    with pytest.raises(ConfigError):
        round_with(torch.zeros(2), "nearest")  # type: ignore[arg-type]
