"""The task metric of generated text against the dataset's raw references, from the reference
libraries: ROUGE-1/2/L and ROUGE-Lsum F1 (rouge-score) for summarization, BLEU and chrF
(sacrebleu) for translation. Language modelling has none (its losses are in evaluate)."""
from __future__ import annotations

import importlib.util
import re
import sys

from pipeline.io.progress import Progress

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> str:
    """Newline-separated sentences for ROUGE-Lsum: the text's own lines (CNN/DailyMail highlights
    are one per line); a text without line breaks is split after . ! ? followed by a space."""
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    if len(lines) > 1:
        return "\n".join(lines)
    return "\n".join(s for s in _SENTENCE_END.split(text.strip()) if s)


ROUGE = ("rouge1", "rouge2", "rougeL", "rougeLsum")
# nltk's packages whose __init__ rouge_score does not need (below).
_BARE = ("nltk", "nltk.stem")


def rouge_scorer_module():
    """rouge_score.rouge_scorer, imported without running nltk's package __init__ files.

    rouge-score takes two things from nltk: the Porter stemmer (nltk.stem.porter, its own small
    module) and, only under split_summaries=True, nltk.sent_tokenize (never here: `sentences`
    splits the text itself). But `import nltk` runs nltk/__init__.py, which loads most of nltk
    and with it scipy and scikit-learn: ~1.5 s of every evaluate and knockout stage of a
    summarization study (benchmarks/stage_overhead.py), for a stemmer that loads in 0.05 s.
    So `nltk` and `nltk.stem` are registered as bare packages while rouge_score is imported: the
    same Porter stemmer code runs, so the scores are the same. They are unregistered afterwards,
    so a later `import nltk` in this process loads the real package. Where nltk is loaded already,
    or its layout differs, the plain import runs."""
    if "rouge_score.rouge_scorer" not in sys.modules and "nltk" not in sys.modules:
        before = set(sys.modules)
        try:
            for name in _BARE:  # the parent first: find_spec of nltk.stem would import nltk whole
                spec = importlib.util.find_spec(name)
                if spec is None or not spec.submodule_search_locations:
                    raise ImportError(f"{name} is not a package")
                sys.modules[name] = importlib.util.module_from_spec(spec)  # not executed
            from rouge_score import rouge_scorer
            return rouge_scorer
        except Exception:  # noqa: BLE001 - another nltk than the one this was written for: import it whole
            for name in set(sys.modules) - before:
                if name.split(".")[0] in ("nltk", "rouge_score"):
                    del sys.modules[name]
        finally:
            for name in _BARE:
                if name not in before:
                    sys.modules.pop(name, None)
    from rouge_score import rouge_scorer
    return rouge_scorer


def task_metrics(task: str, references: list[str], predictions: list[str]) -> dict:
    if task == "summarization":
        rouge_scorer = rouge_scorer_module()
        # rougeL: one LCS over the whole summary; rougeLsum: summary-level LCS over its sentences
        # (newline-separated), the variant published CNN/DailyMail numbers use.
        scorer = rouge_scorer.RougeScorer(list(ROUGE), use_stemmer=True)
        scores = []
        # Stemmed LCS over thousands of long summaries takes a while: it shows progress too.
        with Progress("evaluate: ROUGE", total=len(references), unit="ex") as bar:
            for r, p in zip(references, predictions):
                scores.append(scorer.score(sentences(r), sentences(p)))
                bar.update(1)
        return {k: sum(s[k].fmeasure for s in scores) / max(1, len(scores)) for k in ROUGE}
    if task == "translation":
        import sacrebleu

        # Detokenized text against one reference each, sacrebleu's defaults (13a, chrF n=6 beta=2).
        return {"bleu": sacrebleu.corpus_bleu(predictions, [references]).score,
                "chrf": sacrebleu.corpus_chrf(predictions, [references]).score}
    return {}
