"""One module per pipeline stage; each exposes a plain function the CLI calls."""
