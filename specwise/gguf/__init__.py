"""GGUF files read from their header: tensors, config, tokenizer, a description, and the model built from them."""
