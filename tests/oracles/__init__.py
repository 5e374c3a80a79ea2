"""Exact oracles for the sampler tests: enumerable toy distributions, their exact
planners and denoisers, the exact law of every sampler, and the statistics that
compare samples with a law."""
