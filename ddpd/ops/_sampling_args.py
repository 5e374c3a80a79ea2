"""Kept for ddpd.sampling.noise, which imports BELOW_ONE and gumbel from here; they are
public in ddpd.ops.rng. Delete this file once nothing imports it."""
from ddpd.ops.rng import BELOW_ONE, gumbel  # noqa: F401
