"""`wkvlab presets` lists every weight and KV name and form the README promises."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def _readme_names(option: str) -> list[str]:
    """The `backticked` names of the README bullet that documents ``option``."""
    text = README.read_text(encoding="utf-8")
    bullet = re.search(rf"^- `{option}`:(.*?)(?=^- `--|\Z|^\S)", text, re.S | re.M)
    assert bullet, f"README has no bullet for {option}"
    names = re.findall(r"`([^`]+)`", bullet.group(1))
    return [n for n in names if not n.startswith(("--", "wkvlab")) and not n.endswith(".md")]


def test_every_name_the_readme_mentions_is_listed():
    proc = subprocess.run([sys.executable, "-m", "wkvlab.cli", "presets"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "400"})
    assert proc.returncode == 0, proc.stderr
    listed = proc.stdout
    names = _readme_names("--weights") + _readme_names("--kv")
    assert len(names) > 40  # the bullets were found and read
    missing = [n for n in names if n not in listed]
    assert not missing, f"README names missing from 'wkvlab presets': {missing}"
    for must in ("none", "bf16", "fp16", "int8", "int4-g128", "int<b>[-g<G>][-sym|-asym][-fmin]"):
        assert re.search(rf"(^|\s|│){re.escape(must)}(\s|│|$)", listed, re.M), must


def test_listing_examples_parse():
    from wkvlab.listing import check_examples

    check_examples()


def test_the_command_shows_engine_checked_only_on_rows_with_a_recorded_check():
    import json

    import wkvlab.kv

    checks = json.loads((Path(wkvlab.kv.__file__).parent / "fidelity_checks.json").read_text(encoding="utf-8"))["checks"]
    proc = subprocess.run([sys.executable, "-m", "wkvlab.cli", "presets"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "400"})
    assert proc.returncode == 0, proc.stderr
    rows = {}
    for line in proc.stdout[proc.stdout.index("KV presets"):].splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 4 and cells[0]:
            rows[cells[0]] = cells[2]  # a row's first line: its name and the label's first words
    assert rows["llamacpp:f16"].startswith("identity") and rows["llamacpp:q4_0+norot"].startswith("source-faithful")
    assert rows["llamacpp:<k>/<v>"].startswith("source-faithful")
    shown = {name for name, label in rows.items() if label.startswith("engine-checked")}
    # a check backs the label only where the rule decided its ratio equivalent within ±band (Holm over its run's types)
    assert shown == {c["preset"] for c in checks if c.get("outcome") == "within"}
    # SmolLM2's 32-window check decided q4_0 equivalent (its 8-window 95% interval had left the band); x86: point ratios
    assert {"llamacpp:q4_0", "llamacpp:q8_0"} <= shown and "llamacpp-x86:q8_0" not in shown
