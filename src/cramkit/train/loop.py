"""The names earlier code imports from ``cramkit.train.loop``: the engine now lives in
``cramkit.train.trainer`` (:class:`~cramkit.train.trainer.Trainer`), the objectives in
``cramkit.train.objectives``."""

from cramkit.train.objectives import MLMObjective, Objective, TrainData
from cramkit.train.trainer import TrainingInterrupted, TrainResult, fit, forward_backward, train

__all__ = ["MLMObjective", "Objective", "TrainData", "TrainResult", "TrainingInterrupted", "fit",
           "forward_backward", "train"]  # fmt: skip
