"""The models: the Transformer and the RNN with attention, their layers, int8 decoding layers.

A model knows nothing of files, tokenizers or search: it imports only `nmt.config` and
`nmt.errors` (tests/test_architecture.py checks it)."""
