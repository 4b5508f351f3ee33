"""Self-training (``cramkit finetune --unlabelled``): a fine-tuned teacher labels the user's unlabelled text
(``recipe``), its labels sharpened by the task's class prior (``prior``) and by the labelled examples' nearest
neighbours (``neighbours``), and a student fine-tuned on them is kept only on evidence. The teacher's labels are
distillation's (:mod:`cramkit.distillation.teacher`); the fine-tuning is the recipes'."""
