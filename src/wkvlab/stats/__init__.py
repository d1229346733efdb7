"""Statistics that compare configs evaluated on the same tokens (paired, resampled by window)."""
from wkvlab.stats.bootstrap import Interval, paired_interval, unit_resampling_weights

__all__ = ["Interval", "paired_interval", "unit_resampling_weights"]
