"""Conversion between nmt checkpoints and other toolkits' model formats: `nmt import` of Hugging
Face MarianMT and Marian models, `nmt export` to CTranslate2, both through one weight table
(`nmt.convert.table`).

May import the models and the top-level modules."""
