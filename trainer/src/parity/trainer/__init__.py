"""parity.trainer: The asynchronous REINFORCE Zero trainer on Ray and the parity command line."""
