"""Build a dataset: filter -> infer-persona -> gen-queries -> split -> stats -> push (and merge)."""
