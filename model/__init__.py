"""Hand-built Transformer (pure torch)."""
