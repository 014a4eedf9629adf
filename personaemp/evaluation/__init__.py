"""Evaluate models the paper's way: criteria -> respond -> evaluate -> table."""
