"""Tasks for fine-tuning and evaluation: the registry, GLUE, SuperGLUE, CLUE/FewCLUE, metrics, user tasks from files.

from cramkit.tasks import get_task
task = get_task("glue/sst2", data_dir="glue_data")
task.examples("dev")[0]   # Example(text_a=..., text_b=None, label=1, idx=0)
"""

from cramkit.tasks import (
    clue,  # noqa: F401  (registers clue/*)
    glue,  # noqa: F401  (registers glue/*)
    superglue,  # noqa: F401  (registers superglue/*)
)
from cramkit.tasks.files import task_from_file
from cramkit.tasks.metrics import compute_metrics, glue_average, glue_scores
from cramkit.tasks.registry import (
    Example,
    Suite,
    Task,
    get_suite,
    get_task,
    list_suites,
    list_tasks,
    register_suite,
    register_task,
)

__all__ = [
    "Example",
    "Suite",
    "Task",
    "compute_metrics",
    "get_suite",
    "get_task",
    "glue_average",
    "glue_scores",
    "list_suites",
    "list_tasks",
    "register_suite",
    "register_task",
    "task_from_file",
]
