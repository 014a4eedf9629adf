"""Build the dataset: filter -> infer-persona -> gen-queries -> split -> stats -> push (and merge)."""
