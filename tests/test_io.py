import json
import os
import stat

import pytest

from wkvlab.errors import ConfigError
from wkvlab.io import write_json_atomic


def test_non_finite_numbers_become_null_so_strict_parsers_accept_the_file(tmp_path):
    out = tmp_path / "r.json"
    write_json_atomic(out, {"ratio": float("nan"), "xs": [1.5, float("inf"), (float("-inf"),)]})
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"ratio": None, "xs": [1.5, None, [None]]}


def test_file_mode_follows_the_umask_not_mkstemps_0600(tmp_path):
    old = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "r.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o644


def test_missing_folder_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        write_json_atomic(tmp_path / "nope" / "r.json", {})
