"""Training: corpora and tokenizers, DDPD objectives, and the training loop."""
