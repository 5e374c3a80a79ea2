"""The command-line tools ddpd-sample, ddpd-train and ddpd-eval (docs/cli.md)."""
