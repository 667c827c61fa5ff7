"""scripts/gpu_carry.py's closure: what the offline GPU machine gets carried, read from this venv's
installed metadata. CPU only, no network."""
from __future__ import annotations

from scripts.gpu_carry import NOT_NEEDED, closure


def test_the_carried_closure_leaves_out_what_no_gpu_part_imports():
    full = closure(["mlflow", "rouge-score"])
    kept = closure(["mlflow", "rouge-score"], NOT_NEEDED)
    assert {"docker", "graphene", "nltk", "rouge-score"} <= full  # the control: they are required
    assert not kept & NOT_NEEDED
    # What the report's MLflow mirror imports (its sqlite store) stays.
    assert {"mlflow", "mlflow-skinny", "sqlalchemy", "alembic"} <= kept
