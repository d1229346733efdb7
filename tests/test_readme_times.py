"""The README's times for `make demo` and `make test` are the rendering of their run record (issue #42 item 6):
scripts/readme_times.py records fresh-clone runs with the load sampled during them and writes the sentences."""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("readme_times", ROOT / "scripts" / "readme_times.py")
readme_times = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme_times)


def test_the_readme_is_the_records_rendering_and_its_demo_range_includes_a_loaded_run():
    runs = readme_times.load_record()
    text = (ROOT / "README.md").read_text()
    assert readme_times.render(text, runs) == text, "run: python scripts/readme_times.py readme"
    assert text.count("<!-- readme-times: ") == 2
    demo = [r for r in runs if r["target"] == "demo" and r["returncode"] == 0]
    assert max(r["load"]["max"] for r in demo) >= readme_times.LOADED  # issue 42: the range includes a run at load >= 4
    assert all(r["load"]["sampled"] for r in demo if r["date"] >= "2026-12-06")  # the script's runs sample the load


def test_a_sentence_gives_the_range_its_ends_loads_and_says_when_no_run_was_loaded():
    def run(wall, low, high, commit, rc=0):
        return {"target": "test", "commit": commit, "date": "2026-12-06", "install_s": 60.0, "wall_s": wall, "returncode": rc,
                "load": {"min": low, "median": (low + high) / 2, "max": high, "sampled": True}, "cores": 2}

    runs = [run(356.0, 0.7, 1.2, "aaaaaaa"), run(930.0, 3.0, 3.9, "bbbbbbb"), run(2000.0, 9.0, 9.0, "ccccccc", rc=2)]
    text = readme_times.sentence("test", runs)
    assert text.startswith("From a fresh clone on a 2-core machine it took 5–16 minutes: 5:56 at load 0.7–1.2, median 0.9 "
                           "(aaaaaaa; install 1:00 of it) to 15:30 at load 3.0–3.9, median 3.5 (bbbbbbb; install 1:00 of it).")
    assert "(2 runs;" in text and text.endswith("No recorded run yet had a load of 4 or more.")  # the failed run is not counted
    runs[1]["load"]["max"] = 4.2
    assert not readme_times.sentence("test", runs).endswith("4 or more.")


def test_the_load_is_sampled_during_the_run_not_only_before_it():
    values = iter([1.0, 5.0, 7.5, 2.0] + [2.0] * 100)
    with readme_times.LoadSampler(period=0.01, read=lambda: next(values)) as sampler:
        time.sleep(0.05)
    summary = sampler.summary()
    assert summary["min"] == 1.0 and summary["max"] == 7.5 and summary["sampled"] and summary["samples"] >= 4
