"""The specs, their parsers, byte counts and the whole planner import without torch (issue #16; see #18)."""
from __future__ import annotations

import subprocess
import sys


def test_plan_and_spec_modules_do_not_import_torch():
    code = ("import sys; import wkvlab.plan, wkvlab.plan.cli, wkvlab.kv.spec, wkvlab.kv.presets, wkvlab.weights.parse, "
            "wkvlab.weights.storage, wkvlab.plan.source; "
            "wkvlab.plan.plan('Llama-3-8B', 'H100', 4, 4096, gpus=2); "
            "wkvlab.plan.resolve_source('default'); "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
