"""cramkit.train: the engine (trainer.py) and the recipes that feed it (pretraining, fine-tuning)."""
