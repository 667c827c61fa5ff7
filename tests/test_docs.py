"""The README and docs/ as a reader meets them: every relative link and image resolves (a file, and
a `#anchor` into a markdown page as GitHub makes it), every page is in the README's map, and the
README stays a front door (short, with the two commands CI and users run)."""
from __future__ import annotations

import hashlib
import importlib
import json
import re
from pathlib import Path

import pytest

from tests.committed import default_params
from tests.tiny_project import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """`text` without fenced code blocks and code spans (a `[x](y)` or `# x` there is not markdown)."""
    return CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: link text kept, markup dropped, lower case, punctuation
    dropped (letters, digits, `_` and `-` kept), each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")  # GitHub numbers repeated headings
    return out


def broken_links(page: Path) -> list[str]:
    """Each relative link or image in `page` that does not resolve, as 'target: why'."""
    bad = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = page if not path else (page.parent / path).resolve()
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    return bad


def test_slug_matches_githubs_anchors():
    assert slug("Fair comparisons: own learning rates, power, sizes, FLOP budgets") == \
        "fair-comparisons-own-learning-rates-power-sizes-flop-budgets"
    assert slug("Several GPUs or nodes (torchrun)") == "several-gpus-or-nodes-torchrun"
    assert slug("The default study (embedded synthetic data)") == "the-default-study-embedded-synthetic-data"
    assert slug("Which `documents` mode fits — a *text* file") == "which-documents-mode-fits--a-text-file"


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## Known part\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#known-part) [gone](missing.md) [bad](other.md#unknown) [self](#title)\n"
                    "![img](img/none.png) [web](https://example.org/x) `[code](nowhere.md)`\n"
                    "```\n[fenced](nowhere.md)\n```\n")
    assert broken_links(page) == ["missing.md: no such file", "other.md#unknown: no heading with anchor #unknown in other.md",
                                  "#title: no heading with anchor #title in page.md", "img/none.png: no such file"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    # The two commands, exactly as CI (.ci/run) and a user run them
    assert re.search(r"^bash run\.sh +#", text, re.M) and re.search(r"^bash run\.sh test +#", text, re.M)
    assert "bash run.sh test" in (ROOT / ".ci" / "run").read_text()
    # Both pictures, from the browser test (tests/test_screenshots.py writes them to docs/img/)
    assert {"docs/img/report-first-screen.png", "docs/img/mlflow-compare-variants.png"} <= set(LINK.findall(text))
    # Every docs page is on the README's map
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in LINK.findall(prose(text))}
    assert {p for p in PAGES[1:]} <= linked, sorted(p.name for p in set(PAGES[1:]) - linked)


def test_adding_a_switch_is_on_the_map_and_names_real_code():
    page = ROOT / "docs" / "adding-a-switch.md"
    text = page.read_text(encoding="utf-8")
    assert broken_links(page) == []
    # Reached from the front door and from where the switches are listed
    assert "docs/adding-a-switch.md" in LINK.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    assert "adding-a-switch.md" in LINK.findall((ROOT / "docs" / "pipeline-and-params.md").read_text(encoding="utf-8"))
    # Every file it sends a reader to exists, and every name it cites is in the module it names
    for path in set(re.findall(r"`((?:model|pipeline|scripts|tests)/[\w/]+\.py)`", text)):
        assert (ROOT / path).is_file(), path
    cited = {"model.config": ["ModelConfig", "_CHOICES", "ARCHS"], "model.knockout": ["COUNTERPARTS", "PARTS", "KINDS", "MODES", "ATTENTIONS", "Knock", "plan", "knockout"],
             "pipeline.params": ["KnockoutParams", "model_fields", "FROM_TOKENIZER"], "pipeline.train": ["flops_per_target_token"],
             "pipeline.reporting.knockout": ["PART_NAMES", "COUNTERPART_EXTRAS"], "model": ["build_model"]}
    for module, names in cited.items():
        for name in names:
            assert f"`{name}" in text or f"`{module}.{name}" in text or name in text, (module, name)
            assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


def test_the_readme_mlflow_picture_is_of_the_committed_default_studys_runs():
    # tests/test_screenshots.py takes it from the store `bash run.sh` leaves and writes this record
    # beside it; here, without a browser, the record is held to the committed report and params.
    from PIL import Image

    from pipeline.reporting.mlflow_view import VIEW_QUERY

    picture = ROOT / "docs" / "img" / "mlflow-compare-variants.png"
    record = json.loads(picture.with_suffix(".json").read_text())
    assert hashlib.sha256(picture.read_bytes()).hexdigest() == record["png_sha256"], \
        "the picture is not the one the browser test took: retake it (tests/test_screenshots.py's docstring)"
    with Image.open(picture) as im:
        assert list(im.size) == record["window"] == [1280, 900]
    assert record["url"].endswith(VIEW_QUERY) and "workflowType=machine_learning" in record["url"]
    params = default_params()  # the committed default study's, whatever the workspace's params.yaml holds
    assert record["runs"] == sorted(f"{v}-{s}" for v in params["ablations"] for s in params["seeds"])
    report = json.loads((ROOT / "reports" / "metrics.json").read_text())
    assert report["primary_metric"] == "val_loss"  # so each variant's "mean" is its mean val_loss
    assert record["val_loss_mean"] == {v: pytest.approx(report[v]["mean"], rel=1e-9) for v in params["ablations"]}, \
        "the picture's runs are not the committed report's: retake it after `bash run.sh`"
