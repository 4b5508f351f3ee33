"""Recipes: what cramkit trains, on the one engine (``cramkit.train``).

- ``pretrain``: budgeted masked-LM pretraining from text or a token store (the Cramming recipe); ``pretrain_inputs``:
  the run's tokenizer and token store, prepared and cached in the run directory;
- ``adapt``: starting from a model (``--from``), growing its vocabulary, knowledge inheritance;
- ``finetune``: a task's head, prompt-based fine-tuning, deep prompts, SetFit; per seed, with checkpoints. Its
  rooms: ``finetune_config`` (the settings), ``finetune_model`` (the model each method trains, its inputs and
  scores), ``finetune_objective`` (the classifier's objective for the engine), ``finetune_prompt`` (prompts and
  their zero-shot score), ``setfit`` (SetFit's pairs, body and head);
- ``contrastive``: the contrastive stage (an encoder trained to embed); ``contrastive_config``, ``contrastive_data``
  (pairs, reading, batching), ``contrastive_loss`` (InfoNCE);
- ``learning_rate``: the learning rate "auto" of the recipes that start from a trained encoder (by its width);
- ``multitask``: mixtures of tasks (one encoder, a head per task);
- ``evaluate``: suites (GLUE, SuperGLUE, CLUE) and few-shot protocols (LM-BFF's, FewCLUE's).

The engine below knows nothing of models on disk or of tasks; recipes bring both (``cramkit.load``,
``cramkit.tasks``) to it.
"""

# the few-shot protocol's splits of K labelled rows per class (LM-BFF's five), and the share of the training rows
# held out for scoring when a task from the user's files has no dev file; the verbs' and flags' defaults read these
FEW_LABEL_ROWS = 1000  # fewer labelled training rows than this: finetune names the few-label methods first
FEWSHOT_SPLITS = 5
DEV_FRACTION = 0.1
