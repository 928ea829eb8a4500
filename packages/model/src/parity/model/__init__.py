"""parity.model: The decoder, its aligned and standard kernels, HF safetensors I/O, tokenizers and chat rendering."""
