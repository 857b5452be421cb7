"""Conversion between nmt checkpoints and other toolkits' model formats (CTranslate2 export).

May import the models and the top-level modules."""
