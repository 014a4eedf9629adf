"""personaemp: build personalized-empathy datasets from long-term user-AI interaction data."""

__version__ = "0.1.0"
