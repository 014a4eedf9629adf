"""LLM engine: the only package that talks to chat-completion endpoints."""
