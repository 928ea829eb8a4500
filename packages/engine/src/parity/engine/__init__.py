"""parity.engine: The aligned rollout engine: paged KV cache, continuous batching, prefix cache, sampling with recorded logprobs."""
