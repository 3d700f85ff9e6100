"""Serving through vLLM's OpenAI-compatible server: the hand-over from the CLI, and the plugins vLLM loads."""
