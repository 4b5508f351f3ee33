"""Recipes: what cramkit trains, on the one engine (``cramkit.train``).

- ``pretrain``: budgeted masked-LM pretraining from text or a token store (the Cramming recipe);
- ``adapt``: starting from a model (``--from``), growing its vocabulary, knowledge inheritance;
- ``finetune``: a task's head, prompt-based fine-tuning, deep prompts; per seed, with checkpoints;
- ``multitask``: mixtures of tasks (one encoder, a head per task);
- ``evaluate``: suites (GLUE, SuperGLUE, CLUE) and few-shot protocols (LM-BFF's, FewCLUE's).

The engine below knows nothing of models on disk or of tasks; recipes bring both (``cramkit.load``,
``cramkit.tasks``) to it.
"""
