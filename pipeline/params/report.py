"""The `report` section: the report stage's keys, the reference point the baseline is set beside
and the seed study's claims."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from pipeline.params.section import Section


class Reference(Section):
    """A published or separately measured result the baseline is compared with (e.g. nanoGPT's)."""
    metric: str  # an eval.json metric, e.g. val_loss
    value: float  # its mean over the reference's runs
    source: str  # where the number comes from, shown beside it
    # Its spread, so the report can test the difference instead of eyeballing it (Welch's t-test):
    # `ci` (half-width of a 95% t-interval) or `std` (of the runs, ddof 1), with `n` runs.
    ci: float | None = Field(None, ge=0)
    std: float | None = Field(None, ge=0)
    n: int | None = Field(None, ge=1)
    description: str | None = None  # how it was measured, e.g. "whole validation split, seeds 1337-1339"
    # Which quantity `value` is, so the report sets it beside the same one of ours: whole_split,
    # `metric` over the whole split (the evaluate stage's, of the model train kept); best_estimate,
    # the lowest in-loop estimate of a run (nanoGPT's "best val loss"; ours: train.json's
    # val_estimate_best, set train.eval_windows and train.keep to match how it was taken).
    quantity: Literal["whole_split", "best_estimate"] = "whole_split"

    @model_validator(mode="after")
    def _spread_with_n(self) -> "Reference":
        if self.ci is not None and self.std is not None:
            raise ValueError("give ci or std, not both")
        if (self.ci is not None or self.std is not None) != (self.n is not None):
            raise ValueError("ci or std needs n (the runs behind the value), and n needs ci or std")
        if self.ci is not None and self.n < 2:
            raise ValueError("ci needs n >= 2 (one run has no interval)")
        if self.quantity == "best_estimate" and self.metric != "val_loss":
            raise ValueError(f"quantity best_estimate is an in-loop validation loss: metric must be val_loss, "
                             f"got {self.metric!r}")
        return self


# report.seed_claims: which keys each way of reading our quantity needs, and which it also takes
# (pipeline/reporting/claims.py reads them; its docstring says what each reading is).
CLAIM_READS = {"delta": ({"variant", "metric", "expect"}, {"versus", "seed_value", "tolerance"}),
               "ppl_ratio": ({"variant", "expect"}, {"versus", "metric", "seed_value"}),
               "time_ratio": ({"variant", "expect"}, {"versus", "seed_value"}),
               "value": ({"metric", "seed_value", "tolerance"}, {"variant"}),
               "plateau": ({"variant", "expect"}, set()),
               "early_loss": ({"variant", "expect"}, {"versus"}),
               "param_count": ({"config", "components", "seed_value", "tolerance"}, set()),
               "filter_kept": ({"seed_value", "tolerance"}, {"split"}),
               "none": (set(), set())}
CLAIM_EXPECT = {"delta": ("worse", "better", "same"), "ppl_ratio": ("lower", "higher"),
                "time_ratio": ("lower", "higher"), "plateau": ("stays", "leaves"), "early_loss": ("lower", "higher")}
COMPONENTS = ("attention", "ffn", "norms", "other", "embeddings")  # model.param_counts()' parts


class SeedClaim(Section):
    """One claim of the seed study, and how to read our same quantity from the report's own data
    (never a number of ours typed in): the report's "Seed's claims" section sets them side by side."""
    claim: str  # the claim in the seed's words, short
    seed_says: str  # the seed's number or words, quoted exactly
    quantity: str  # what quantity that is, in words
    read: Literal["delta", "ppl_ratio", "time_ratio", "value", "plateau", "early_loss", "param_count",
                  "filter_kept", "none"]
    variant: str | None = None  # a key of ablations (value: the baseline when unset)
    versus: str | None = None  # delta, ratios: the variant it is compared with (the baseline when unset)
    metric: str | None = None  # a reported metric (value: or train_loss, train.json's last logged)
    split: str | None = None  # filter_kept: the filter.json split (train when unset)
    # the seed's direction; plateau: whether the arm's loss stays at the unigram plateau (it does not
    # converge) or leaves it
    expect: Literal["worse", "better", "same", "lower", "higher", "stays", "leaves"] | None = None
    # param_count: a model the seed counted by hand, as settings over the baseline's model section
    # (its vocabulary as vocab_size), and which of our model's parameter counts its sum covers
    config: dict[str, Any] | None = None
    components: list[Literal[COMPONENTS]] | None = None
    seed_value: float | None = None  # the seed's number on our quantity's scale
    # value, filter_kept: how near counts as the same (not needed with comparable false); delta same: the margin
    tolerance: float | None = Field(None, ge=0)
    comparable: bool = True  # false: not the seed's quantity; ours is shown, the check says "not comparable"
    # What the seed's number came from, which ours must share for a verdict (else "not comparable",
    # the difference named): settings every run behind it had, e.g. {model: {decoder_mask: future_only}},
    # checked against the variant's (and `versus`') resolved settings; its passes over its training
    # data (epochs), against ours (train.json passes): one budget class within a factor of 10.
    seed_conditions: dict[Literal["model", "train"], dict[str, Any]] | None = None
    seed_passes: float | None = Field(None, gt=0)
    why: str  # the reason beside the check: the arm that differs, the leak, the data, placeholders

    @model_validator(mode="after")
    def _keys_of_its_read(self) -> "SeedClaim":
        needs, takes = CLAIM_READS[self.read]
        if not self.comparable:  # shown, not checked: no margin of "the same" to give
            needs, takes = needs - {"tolerance"}, takes | {"tolerance"}
        given = {k for k in self.model_fields_set if getattr(self, k) is not None}
        expects = ", ".join(CLAIM_EXPECT.get(self.read, ()))
        if missing := sorted(needs - given):
            raise ValueError(f"read {self.read} needs {missing[0]}"
                             + (f" ({expects})" if missing[0] == "expect" else ""))
        if extra := sorted(given & {"variant", "versus", "metric", "split", "expect", "seed_value", "tolerance",
                                    "config", "components"}
                           - needs - takes):
            raise ValueError(f"read {self.read} does not take {extra[0]}")
        if self.expect is not None and self.expect not in CLAIM_EXPECT[self.read]:
            raise ValueError(f"read {self.read} takes expect {expects}, not {self.expect!r}")
        if self.read == "delta" and self.tolerance is not None and self.expect != "same":
            raise ValueError("read delta takes tolerance with expect same only (the margin of 'no difference')")
        if self.versus is not None and self.versus == self.variant:
            raise ValueError(f"versus {self.versus!r} is the claim's variant itself")
        if self.read == "ppl_ratio" and self.metric not in (None, "val_loss", "test_loss"):
            raise ValueError(f"read ppl_ratio is exp(Δ val_loss or test_loss): metric {self.metric!r} is neither")
        return self


class ReportParams(Section):
    baseline: str = "baseline"
    experiment: str = "ablation-lab"  # MLflow experiment that holds every run
    notes: list[str] = []  # the preset author's text, printed in the report as such (never checked)
    # The data digest (the report's "Data as run" line) the notes were written for: when this
    # run's data differs, the report flags the notes as possibly not describing it.
    notes_data_digest: str | None = None
    reference: Reference | None = None
    # The one metric whose paired test vs the baseline is not corrected for multiplicity; None:
    # val_loss (pipeline.reporting.results.DEFAULT_PRIMARY says why). The others are Holm-corrected.
    primary_metric: str | None = None
    # The seed study's claims beside ours (pipeline/reporting/claims.py); empty: no such section.
    seed_claims: list[SeedClaim] = []
