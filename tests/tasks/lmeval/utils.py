"""The wkvlab_facts task's data: a JSONL file next to this one (lm-eval calls ``load_facts`` through ``custom_dataset``)."""
import json
from pathlib import Path


def load_facts(**_metadata):
    import datasets

    rows = [json.loads(line) for line in (Path(__file__).parent / "facts.jsonl").read_text().splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
