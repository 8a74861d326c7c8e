"""Translation with a GPipe Transformer encoder-decoder."""
