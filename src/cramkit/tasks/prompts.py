"""Built-in prompts (a template and label words) for the registry's classification tasks, after LM-BFF's
manual prompts for GLUE (Gao et al. 2021, Table 1) and PET's for FewCLUE (Xu et al. 2021). A user's own
``--prompt`` / ``--label-words`` replace them; tasks without one (IFLYTEK's 119 numbered classes, CSLDCP's
names of many lengths, multiple choice, regression) need the user's.

The template syntax and the checks are :mod:`cramkit.data.prompts`'.
"""

from __future__ import annotations

from cramkit.tasks.clue import TNEWS_LABELS, TNEWS_NAMES

_YES_NO = "{text_a} ? [MASK] , {text_b}"
_ZH_PAIR = "{text_a}？[MASK]，{text_b}"
_TNEWS_WORDS = {
    "news_story": "故事",
    "news_culture": "文化",
    "news_entertainment": "娱乐",
    "news_sports": "体育",
    "news_finance": "财经",
    "news_house": "房产",
    "news_car": "汽车",
    "news_edu": "教育",
    "news_tech": "科技",
    "news_military": "军事",
    "news_travel": "旅游",
    "news_world": "国际",
    "news_stock": "股票",
    "news_agriculture": "农业",
    "news_game": "电竞",
}

# task name -> (template, {label: word})
BUILTIN: dict[str, tuple[str, dict[str, str]]] = {
    "glue/sst2": ("{text_a} It was [MASK] .", {"0": "terrible", "1": "great"}),
    "glue/cola": ("{text_a} This is [MASK] .", {"0": "incorrect", "1": "correct"}),
    "glue/mrpc": ("{text_a} [MASK] , {text_b}", {"0": "no", "1": "yes"}),
    "glue/qqp": ("{text_a} [MASK] , {text_b}", {"0": "no", "1": "yes"}),
    "glue/rte": (_YES_NO, {"entailment": "yes", "not_entailment": "no"}),
    "glue/qnli": (_YES_NO, {"entailment": "yes", "not_entailment": "no"}),
    "glue/wnli": (_YES_NO, {"0": "no", "1": "yes"}),
    "glue/mnli": (_YES_NO, {"entailment": "yes", "neutral": "maybe", "contradiction": "no"}),
    "superglue/rte": (_YES_NO, {"entailment": "yes", "not_entailment": "no"}),
    "superglue/cb": (_YES_NO, {"entailment": "yes", "neutral": "maybe", "contradiction": "no"}),
    "clue/eprstmt": ("{text_a}总之很[MASK]。", {"Positive": "好", "Negative": "差"}),
    "clue/tnews": (
        "这是一则[MASK]新闻：{text_a}",
        {code: _TNEWS_WORDS[name] for code, name in zip(TNEWS_LABELS, TNEWS_NAMES, strict=True)},
    ),
    "clue/afqmc": (_ZH_PAIR, {"0": "不", "1": "是"}),
    "clue/bustm": (_ZH_PAIR, {"0": "不", "1": "是"}),
    "clue/ocnli": (_ZH_PAIR, {"entailment": "是", "neutral": "或", "contradiction": "不"}),
    "clue/cmnli": (_ZH_PAIR, {"entailment": "是", "neutral": "或", "contradiction": "不"}),
    "clue/csl": ("[MASK]是关键词：{text_a}。{text_b}", {"0": "不", "1": "都"}),
    "clue/cluewsc": ("{text_a}？[MASK]", {"true": "是", "false": "否"}),
}


# label words to fall back on, in order, where a model's vocabulary cuts the first choice into several
# tokens (a tokenizer trained on a small corpus may not hold "terrible" whole)
# (one cut "yes" in two: a pair task's yes/no/maybe fall back on true/false/perhaps)
_YES_NO_FALLBACK = {"yes": "true", "no": "false", "maybe": "perhaps"}
FALLBACK_WORDS: dict[str, list[dict[str, str]]] = {
    "glue/sst2": [{"0": "bad", "1": "good"}],
    "glue/cola": [{"0": "wrong", "1": "right"}, {"0": "bad", "1": "good"}],
    **{
        name: [{label: _YES_NO_FALLBACK[word] for label, word in words.items()}]
        for name, (_, words) in BUILTIN.items()
        if set(words.values()) <= set(_YES_NO_FALLBACK)
    },
}


def builtin_prompt(task_name: str) -> tuple[str, dict[str, str]] | None:
    """The built-in (template, label words) of a registered task, or None."""
    return BUILTIN.get(task_name)


def builtin_label_words(task_name: str) -> list[dict[str, str]]:
    """A registered task's built-in label words, then the ones to fall back on, in order."""
    first = BUILTIN.get(task_name)
    return ([first[1]] if first else []) + FALLBACK_WORDS.get(task_name, [])
