"""Training: the Trainer and one update, the run directory, the training checkpoint and
resuming, validation, metrics, the loss, the optimizer and schedules, processes under torchrun.

May import the models, decoding (validation translates) and the top-level modules."""
