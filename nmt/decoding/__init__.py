"""Decoding: beam search (beam 1: greedy) and sampling over the search protocol, prediction as a
library (loading, batching, ensembles, workers), alignments, lexical shortlists.

May import the models and the top-level modules; never training, conversion or a command."""
