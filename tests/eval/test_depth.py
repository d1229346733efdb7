"""The seed's depth buckets and the paired penalty growth, on results with a known answer."""
import numpy as np

from wkvlab.eval.depth import depth_buckets, depth_tables
from wkvlab.eval.metrics import position_buckets
from wkvlab.eval.result import EvalResult, TokenArrays
from wkvlab.kv import KVSpec


def test_depth_buckets_double_from_4k():
    assert depth_buckets(32768) == [(0, 4096), (4096, 8192), (8192, 16384), (16384, 32767)]
    assert depth_buckets(65536)[-1] == (32768, 65535)
    assert depth_buckets(4096) == [(0, 4095)]


def test_position_buckets_keep_doubling_past_8k():
    assert position_buckets(32768)[-3:] == [(4096, 8192), (8192, 16384), (16384, 32767)]
    assert position_buckets(512) == [(0, 64), (64, 256), (256, 511)]


def _result(kv: str, kld: np.ndarray, ctx: int, windows: int) -> EvalResult:
    n = ctx - 1
    arrays = TokenArrays(kld=kld, nll_ref=np.zeros(kld.size), nll=np.zeros(kld.size), top1_agree=np.ones(kld.size, bool),
                         delta_p=np.zeros(kld.size), position=np.tile(np.arange(n), windows), window=np.repeat(np.arange(windows), n))
    return EvalResult("m", "d", ctx, "w", kv, {}, KVSpec.parse(kv).to_dict(), 0, 0.0, 0.0, arrays, position_buckets(ctx))


def test_growth_is_found_when_the_penalty_grows_and_not_when_flat():
    rng = np.random.default_rng(0)
    ctx, windows = 16384, 2
    position = np.tile(np.arange(ctx - 1), windows)
    base = np.abs(rng.normal(0.01, 0.005, position.size))  # the 16-bit cache under the same weights
    # per-token KLD is skewed, its spread as large as its mean: exponential noise around the penalty
    growing = base + 0.10 * (1 + position / ctx) * rng.exponential(1.0, position.size)
    flat = base + 0.10 * rng.exponential(1.0, position.size)
    tables = depth_tables([_result("fp16", base, ctx, windows), _result("q4_0", growing, ctx, windows), _result("int4", flat, ctx, windows)])
    assert [t.kv for t in tables] == ["q4_0", "int4"]
    grow, stay = tables
    assert grow.paired_with == "w × fp16"
    assert [(r.start, r.end) for r in grow.rows] == [(0, 4096), (4096, 8192), (8192, 16383)]
    first, last = grow.rows[0], grow.rows[-1]
    assert abs(first.penalty.estimate - 0.10 * (1 + 2047.5 / ctx)) < 0.003  # the mean over 0..4095, by hand
    assert last.growth.low > 0 and grow.summary().startswith(f"8192-16383 minus the first bucket: {last.growth:.4g}")
    assert "not a depth verdict" in grow.summary() and "grows" not in grow.summary()  # described, never decided
    assert abs(last.relative_growth - 0.10 * (12287 - 2047.5) / ctx / first.penalty.estimate) < 0.05
    assert stay.rows[-1].growth.contains(0.0) and "content-confounded" in stay.summary()
    assert grow.units == 2 * (16383 // 256 + 1) and grow.block == 256
    assert grow.lag == 1  # independent noise: decorrelated at once


def test_short_windows_have_no_depth_table():
    ctx = 1024
    kld = np.zeros(ctx - 1)
    assert depth_tables([_result("fp16", kld, ctx, 1), _result("q4_0", kld + 0.1, ctx, 1)]) == []


def test_a_bucket_with_few_blocks_gets_no_interval():
    """4,096–4,607 holds two blocks per window: four units, too few to resample (wkvlab.stats.MIN_UNITS)."""
    ctx, windows = 4608, 2
    position = np.tile(np.arange(ctx - 1), windows)
    kld = 0.1 + 0.01 * (position % 7)
    (table,) = depth_tables([_result("fp16", np.zeros(kld.size), ctx, windows), _result("q4_0", kld, ctx, windows)])
    first, last = table.rows
    assert first.penalty.decided and not last.penalty.decided and not last.growth.decided
    assert last.penalty.n_units == 4 and f"{last.growth:.4g}" in table.summary()
