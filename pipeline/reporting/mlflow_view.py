"""The experiment's saved view "Compare variants" in `mlflow ui`: metric columns, grouped by variant.

MLflow 3 (3.17) keeps the runs table's saved views as experiment tags, one per view: key
`mlflow.sharedViewState.<id>`, value a JSON envelope {name, createdAt, updatedAt, state} whose
`state` is the page's state as a JSON string (search facets + table state: selected columns,
grouping, ...). There is no Python API for them, but a tag written in that form is what the UI's
"Save as new view" writes, so the view is listed in the runs page's views menu and opens at
#/experiments/<id>/runs?viewStateShareKey=<id>. The format is the UI's, not a published schema:
if a later MLflow reads it differently, the view is ignored (the runs are unaffected), and the
docs (docs/tracking.md) say which clicks give the same table by hand.
"""
from __future__ import annotations

import json
import time

VIEW_ID = "ablation-lab-compare"
VIEW_NAME = "Compare variants"
TAG_PREFIX = "mlflow.sharedViewState."
# The runs page's query that opens the view. MLflow 3.17 starts in its GenAI workflow (traces,
# judges, prompts in the side bar) unless told otherwise; these runs are model training, so the link
# says so (`workflowType` is the URL form of the side bar's "Model training" switch).
VIEW_QUERY = f"viewStateShareKey={VIEW_ID}&workflowType=machine_learning"
# The current version of each variant x seed of the main study: not the report run, not an earlier
# version of a run (folded under the current one, but grouping would average it in), not a sweep point.
CURRENT_RUNS = "tags.stage = 'train' AND tags.mlflow.parentRunId IS NULL AND tags.point IS NULL"


def view_state(metrics: tuple[str, ...]) -> dict:
    """The runs page's state: the UI's defaults (MLflow 3.17) with the metric columns and grouping set."""
    return {
        # search facets
        "searchFilter": CURRENT_RUNS, "orderByKey": "attributes.start_time", "orderByAsc": False,
        "startTime": "ALL", "lifecycleFilter": "Active", "datasetsFilter": [], "modelVersionFilter": "All Runs",
        # table and charts
        "selectedColumns": ["attributes.`Dataset`", "attributes.`Duration`"] + [f"metrics.`{m}`" for m in metrics],
        # the metrics beside the run names, where a 1280 px window shows them without scrolling
        "columnOrder": ["attributes.`Run Name`", "runDateAndNestInfo"] + [f"metrics.`{m}`" for m in metrics]
                       + ["attributes.`Duration`", "attributes.`Dataset`"],
        "columnWidths": {}, "runsExpanded": {}, "runsPinned": [], "runsHidden": [],
        "runsVisibilityMap": {}, "runsHiddenMode": "SHOW_ALL", "viewMaximized": False, "runListHidden": False,
        "isAccordionReordered": False, "useGroupedValuesInCharts": True, "hideEmptyCharts": True,
        # mean of each metric over a variant's seeds, one row per variant (expandable to its seeds)
        "groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": "variant"}]},
        "groupsExpanded": {}, "autoRefreshEnabled": True,
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }


def save_comparison_view(client, exp_id: str, metrics: tuple[str, ...]) -> str:
    """Write (or rewrite) the view on experiment `exp_id`; returns its id."""
    now = int(time.time() * 1000)
    envelope = {"name": VIEW_NAME, "createdAt": now, "updatedAt": now,
                "state": json.dumps(view_state(tuple(dict.fromkeys(metrics))), separators=(",", ":"))}
    client.set_experiment_tag(exp_id, TAG_PREFIX + VIEW_ID, json.dumps(envelope, separators=(",", ":")))
    return VIEW_ID
