"""The task metric of generated text against the dataset's raw references, from the reference
libraries: ROUGE-1/2/L and ROUGE-Lsum F1 (rouge-score) for summarization, BLEU and chrF
(sacrebleu) for translation. Language modelling has none (its losses are in evaluate)."""
from __future__ import annotations

import re

from pipeline.progress import Progress

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> str:
    """Newline-separated sentences for ROUGE-Lsum: the text's own lines (CNN/DailyMail highlights
    are one per line); a text without line breaks is split after . ! ? followed by a space."""
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    if len(lines) > 1:
        return "\n".join(lines)
    return "\n".join(s for s in _SENTENCE_END.split(text.strip()) if s)


ROUGE = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def task_metrics(task: str, references: list[str], predictions: list[str]) -> dict:
    if task == "summarization":
        from rouge_score import rouge_scorer

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
