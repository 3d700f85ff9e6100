"""The real vLLM scheduler driven offline: the driver, scripted scenarios, the virtual clock, the trace."""
