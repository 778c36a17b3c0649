"""Talking to llama.cpp: model, contexts, kernels, the crash check, model facts."""
