"""KV Primer: build and test cached prompts on local llama.cpp models."""
__version__ = "0.1.0"
