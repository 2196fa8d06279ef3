"""Data: readers, synthetic data, tokenization cache, samplers."""
