"""Lists that are written down once: model/config.py owns the switches and their values,
model/knockout_plan.py the knock-out parts and counterparts. Where another file must spell one out
(it may not import the owner: a stage would then depend on code it never runs), it is checked here,
so adding a value in the owner fails this file until every copy follows (docs/adding-a-switch.md)."""
from __future__ import annotations

import ast
import re
import typing

import pytest

from model import config as model_config
from model import knockout_plan as model_knockout
from pipeline import params as pipeline_params
from pipeline.reporting import knockout as report_knockout
from scripts import model_switches
from tests.tiny_project import ROOT


def test_the_switch_table_in_the_docs_is_generated_from_model_config():
    model_switches.main(["--root", str(ROOT), "--check"])  # SystemExit naming the fix when stale


def test_a_new_field_makes_the_switch_table_stale(tmp_path):
    for name in (model_switches.SOURCE, model_switches.PAGE):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text())
    source = tmp_path / model_switches.SOURCE
    source.write_text(source.read_text().replace(
        "    bias: bool = True", "    n_kv_heads: int = 0  # key/value heads; 0: as many as n_heads\n    bias: bool = True"))
    with pytest.raises(SystemExit, match="model_switches: .* is stale: run python -m scripts.model_switches"):
        model_switches.main(["--root", str(tmp_path), "--check"])
    model_switches.main(["--root", str(tmp_path)])
    assert "| `n_kv_heads` | `0` | int | key/value heads; 0: as many as n_heads |" in (tmp_path / model_switches.PAGE).read_text()


def test_every_config_comment_that_lists_values_lists_exactly_the_choices():
    source = (ROOT / model_switches.SOURCE).read_text()
    named = model_switches.choices(ast.parse(source))
    assert named == model_config._CHOICES  # the script reads what the dataclass validates against
    listed = {f["name"]: model_switches.listed_choices(f["comment"]) for f in model_switches.fields(source)}
    for name, values in listed.items():
        if values is not None:
            assert set(values) == set(named.get(name, ())), f"model/config.py: {name}'s comment lists {values}"


def test_the_tokenizer_fields_are_the_pipelines():
    assert model_switches.FROM_TOKENIZER == pipeline_params.FROM_TOKENIZER


def literal_values(annotation) -> tuple:
    """The strings a `list[Literal[...]] | None` annotation allows."""
    found = []
    for arg in typing.get_args(annotation) or (annotation,):
        if typing.get_origin(arg) is typing.Literal:
            found += typing.get_args(arg)
        elif typing.get_args(arg):
            found += literal_values(arg)
    return tuple(found)


def test_knockout_params_allow_exactly_the_models_parts_attentions_and_modes():
    fields = pipeline_params.KnockoutParams.model_fields
    assert literal_values(fields["parts"].annotation) == model_knockout.PARTS
    assert literal_values(fields["attentions"].annotation) == model_knockout.ATTENTIONS
    assert literal_values(fields["modes"].annotation) == model_knockout.MODES


def test_the_reports_counterpart_names_and_extras_match_the_models_counterparts():
    counterparts = model_knockout.COUNTERPARTS
    assert set(report_knockout.PART_NAMES) == set(counterparts)  # a new counterpart needs its words in the report
    switches = {field for field, _ in counterparts.values()}
    assert set(report_knockout.COUNTERPART_EXTRAS) <= switches
    config_fields = set(model_config.ModelConfig.__dataclass_fields__)
    assert switches <= config_fields
    assert {k for extra in report_knockout.COUNTERPART_EXTRAS.values() for k in extra} <= config_fields


# A value list of model/config.py copied into a test goes stale silently when a value is added;
# tests import the tuple instead (a subset written out on purpose is fine).
CHOICE_LISTS = {name: values for name, values in vars(model_config).items()
                if name.isupper() and isinstance(values, tuple) and len(values) > 1}


def spelled(values: tuple[str, ...]) -> re.Pattern:
    """Matches the values written out in order as a Python tuple or list's items."""
    return re.compile(r"""['"]\s*,\s*['"]""".join(re.escape(v) for v in values).join(("['\"]", "['\"]")))


@pytest.mark.parametrize("path", sorted(set((ROOT / "tests").glob("*.py")) - {ROOT / "tests" / "test_one_place.py"}),
                         ids=lambda p: p.name)
def test_no_test_copies_a_whole_value_list_of_the_config(path):
    text = path.read_text(encoding="utf-8")
    copies = [name for name, values in CHOICE_LISTS.items() if spelled(values).search(text)]
    assert not copies, f"{path.name} spells out model.config's {copies}: import them instead"


def test_the_copy_finder_finds_a_copy():
    archs = model_config.ARCHS  # written out from the tuple, so a new arch does not stale this test
    assert spelled(archs).search("ARCHS = (" + ", ".join(f'"{a}"' for a in archs) + ")")
    assert spelled(archs).search(str(list(archs)))  # ['encoder_decoder', 'decoder_only', ...]
    assert not spelled(archs).search(str(list(archs[:2])))


def test_the_knockout_docs_name_every_part_mode_attention_and_counterpart():
    text = (ROOT / "docs" / "fair-comparisons-and-knockouts.md").read_text(encoding="utf-8")
    yaml_lines = {line.split(":")[0].strip(): line for line in text.splitlines() if line.startswith("  ")}
    assert f"[{', '.join(model_knockout.PARTS)}]" in yaml_lines["parts"]
    assert f"[{', '.join(model_knockout.MODES)}]" in yaml_lines["modes"]
    assert f"[{', '.join(model_knockout.ATTENTIONS)}]" in yaml_lines["attentions"]
    for field, value in model_knockout.COUNTERPARTS.values():  # the switch each counterpart matches, as YAML
        assert f"`{field}: {str(value).lower() if isinstance(value, bool) else value}`" in text, field
