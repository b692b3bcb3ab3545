"""topology.yaml loading: every mistake is one line naming file, line and key.

The malformed files live in tests/data/bad/; their classes in tests/data/spec_components.py.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from topo.api import Bolt, Spout
from topo.groupings import FieldsGrouping, GlobalGrouping, ShuffleGrouping
from topo.spec import SpecError, import_class, load, load_spec, loads

DATA = Path(__file__).resolve().parent / "data"
BAD = DATA / "bad"
REPO = Path(__file__).resolve().parent.parent
TOPO = REPO / ".venv" / "bin" / "topo"


@pytest.fixture(autouse=True)
def _components_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(DATA))


# file -> (line, key, the rest of the error line)
EXPECTED: dict[str, tuple[int, str, str]] = {
    "syntax.yaml": (4, "syntax", "mapping values are not allowed here "
                                 "(got 'class: spec_components.Sentences: oops')"),
    "empty.yaml": (1, "topology", "the file is empty; expected a mapping with name, spouts, bolts, streams"),
    "unknown_top_key.yaml": (4, "bolt", "unknown key; did you mean 'bolts'?"),
    "flux_classname.yaml": (4, "spouts[0].className", "unknown key; use 'class'"),
    "wrong_type_spouts.yaml": (3, "spouts", "expected a list of spouts "
                                           "(got {'id': 'sentences', 'class': 'spec_components.Sentences'})"),
    "missing_name.yaml": (1, "name", "missing; every topology needs a name"),
    "duplicate_key.yaml": (6, "spouts[0].parallelism", "duplicate key (first at line 5)"),
    "missing_module.yaml": (4, "spouts[0].class", "no module named 'no_such_package' (is it installed, or on "
                                                  "PYTHONPATH?) (got 'no_such_package.spouts.Sentences')"),
    "missing_class.yaml": (4, "spouts[0].class", "spec_components has no attribute 'Sentence' "
                                                 "(got 'spec_components.Sentence')"),
    "broken_module.yaml": (4, "spouts[0].class", "importing broken_module failed: ModuleNotFoundError: No module "
                                                 "named 'a_module_that_is_not_installed' "
                                                 "(got 'broken_module.Sentences')"),
    "bolt_as_spout.yaml": (4, "spouts[0].class", "is a Bolt; list it under bolts (got 'spec_components.Split')"),
    "not_a_component.yaml": (7, "bolts[0].class", "is not a subclass of topo.Bolt "
                                                  "(got 'spec_components.NotAComponent')"),
    "ctor_args.yaml": (5, "spouts[0].args", "Sentences() does not take these arguments: too many positional "
                                            "arguments (got [5, 'text', 'one too many'])"),
    "ctor_missing_arg.yaml": (7, "bolts[0].class", "NeedsPath() does not take these arguments: missing a "
                                                   "required argument: 'path' (got 'spec_components.NeedsPath')"),
    "ctor_raises.yaml": (9, "bolts[0].kwargs", "constructing Picky raised ValueError: level must be at most 3, "
                                               "not 7 (got {'level': 7})"),
    "kwargs_list.yaml": (5, "spouts[0].kwargs", "expected a mapping of keyword arguments (got [5])"),
    "bad_id.yaml": (3, "spouts[0].id", "expected a component id: letters, digits, '_', '.', '-', not starting "
                                       "with '.' or '-' (got 'sentences:1')"),
    "parallelism_zero.yaml": (7, "bolts[0].parallelism", "must be an integer >= 1 (got 0)"),
    "parallelism_string.yaml": (5, "spouts[0].parallelism", "must be an integer >= 1 (got 'two')"),
    "duplicate_id.yaml": (6, "bolts[1].id", "duplicate id (first at line 3) (got 'sentences')"),
    "bad_grouping_type.yaml": (10, "streams[0].grouping.type", "unknown grouping; one of shuffle, fields, all, "
                                                               "global, local_or_shuffle, load_aware; did you mean "
                                                               "'shuffle'? (got 'shufle')"),
    "grouping_args.yaml": (11, "streams[0].grouping.fields", "only a fields grouping takes fields, this one is "
                                                             "'shuffle' (got ['sentence'])"),
    "fields_missing.yaml": (10, "streams[0].grouping.fields", "missing; a fields grouping needs fields: "
                                                              "[name, ...]"),
    "missing_grouping.yaml": (7, "streams[0].grouping", "missing; e.g. grouping: {type: shuffle}"),
    "fields_undeclared.yaml": (15, "streams[1].grouping.fields", "bolt 'count' from 'split': fields grouping on "
                                                                "'wrd' but the upstream declares ['word'] "
                                                                "(got ['wrd'])"),
    "undeclared_stream.yaml": (11, "streams[0].grouping.stream", "bolt 'split' reads stream 'errors' that "
                                                                 "'sentences' does not declare (declared: "
                                                                 "['default']) (got 'errors')"),
    "unknown_component.yaml": (7, "streams[0].from", "unknown component; declared: sentences, split "
                                                     "(got 'sentence')"),
    "into_spout.yaml": (8, "streams[1].to", "is a spout; a stream must go into a bolt (got 'sentences')"),
    "no_inputs.yaml": (6, "bolts[1]", "bolt 'orphan' has no inputs (got 'orphan')"),
    "cycle.yaml": (10, "streams[2]", "cycle a -> b -> a (cycles can deadlock under backpressure, see STORM-3637; "
                                     "break it with an external queue) (got 'b -> a')"),
    "unknown_setting.yaml": (4, "config.queue.hihg_mark", "unknown setting; did you mean 'queue.high_mark'? "
                                                          "(got '10MB')"),
    "bad_config_value.yaml": (3, "config.queue.high_mark", "expected a size such as 50MB, 500KB or a number of "
                                                           "bytes (got 'lots')"),
    "marks_crossed.yaml": (4, "config.queue.low_mark", "must be below queue.high_mark (got 2000000)"),
    "python_tag.yaml": (5, "spouts[0].args", "cannot read value: could not determine a constructor for the tag "
                                             "'tag:yaml.org,2002:python/object/apply:os.system'"),
}


def test_every_bad_file_has_an_expectation() -> None:
    assert sorted(p.name for p in BAD.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_file_gives_one_exact_line(name: str) -> None:
    line, key, rest = EXPECTED[name]
    path = BAD / name
    with pytest.raises(SpecError) as info:
        load(path)
    err = info.value
    assert str(err) == f"{path}:{line}: {key}: {rest}"
    assert (err.line, err.key, len(err.problems)) == (line, key, 1)
    assert "\n" not in str(err)


def test_several_mistakes_are_reported_together() -> None:
    text = """\
name: two mistakes
spouts:
  - {id: s, class: spec_components.Sentences, parallelism: -1}
bolts:
  - {id: b, class: spec_components.Split, paralelism: 2}
streams:
  - {from: s, to: b, grouping: {type: shuffle}}
"""
    with pytest.raises(SpecError) as info:
        loads(text, "two.yaml")
    assert str(info.value).splitlines() == [
        "two.yaml:1: name: expected a topology name: letters, digits, '_', '.', '-', not starting with '.' "
        "or '-' (got 'two mistakes')",
        "two.yaml:3: spouts[0].parallelism: must be an integer >= 1 (got -1)",
        "two.yaml:5: bolts[0].paralelism: unknown key; did you mean 'parallelism'?",
    ]


def test_missing_file_names_the_file() -> None:
    with pytest.raises(SpecError) as info:
        load(DATA / "nope.yaml")
    assert str(info.value) == f"{DATA / 'nope.yaml'}: file: cannot read: No such file or directory"


def test_spec_error_is_a_topology_error() -> None:
    from topo.topology import TopologyError

    with pytest.raises(TopologyError):
        load(BAD / "cycle.yaml")


# --- valid files ---------------------------------------------------------------------

def test_good_file_builds_the_topology() -> None:
    topology = load(DATA / "good.yaml")
    assert topology.name == "wordcount"
    assert list(topology.components) == ["sentences", "split", "count", "audit"]
    assert [c.parallelism for c in topology.components.values()] == [1, 2, 3, 1]
    assert topology.config == {"acking": True, "queue.high_mark": 10_000_000}
    inputs = {c.id: c.inputs for c in topology.bolts}
    assert isinstance(inputs["split"][0].grouping, ShuffleGrouping)
    fields = inputs["count"][0].grouping
    assert isinstance(fields, FieldsGrouping) and fields.fields == ("word",)
    assert isinstance(inputs["audit"][0].grouping, GlobalGrouping)
    assert topology.components["count"].outputs == {"default": ("word", "count"), "totals": ("total",)}


def test_each_task_gets_its_own_instance_with_args() -> None:
    topology = load(DATA / "good.yaml")
    a, b = topology.components["sentences"].instance(), topology.components["sentences"].instance()
    assert a is not b and isinstance(a, Spout)
    assert (a.count, a.text) == (5, "To be or not to be")
    split = topology.components["split"].instance()
    assert isinstance(split, Bolt) and split.lower is True


def test_mutable_args_are_not_shared_between_tasks() -> None:
    spec = loads("""\
name: t
spouts: [{id: s, class: spec_components.Sentences}]
bolts: [{id: c, class: spec_components.Count, kwargs: {seen: [x]}, parallelism: 2}]
streams: [{from: s, to: c, grouping: {type: all}}]
""")
    one, two = (spec.topology.components["c"].instance() for _ in range(2))
    one.seen.append("y")
    assert two.seen == ["x"]


def test_anchors_and_merge_keys() -> None:
    spec = loads("""\
name: t
spouts:
  - &base {id: s, class: spec_components.Sentences, parallelism: 2}
  - {<<: *base, id: s2}
bolts:
  - {id: b, class: spec_components.Split}
streams:
  - {from: s, to: b, grouping: {type: LOCAL_OR_SHUFFLE}}
  - {from: s2, to: b, grouping: {type: load_aware, stream: default}}
""")
    assert spec.topology.components["s2"].parallelism == 2


def test_config_overrides_and_blame() -> None:
    spec = load_spec(DATA / "good.yaml")
    config = spec.resolve_config({"acking": False})
    assert config["acking"] is False and config["queue.high_mark"] == 10_000_000
    assert config["queue.hard_bound"] == 20_000_000
    with pytest.raises(SpecError) as info:
        spec.resolve_config({"queue.low_mark": 20_000_000})
    assert str(info.value) == "--config: queue.low_mark: must be below queue.high_mark (got 20000000)"


def test_import_class_nested_and_errors() -> None:
    assert import_class("topo.api.Spout") is Spout
    with pytest.raises(LookupError, match="dotted name"):
        import_class("Spout")
    with pytest.raises(LookupError, match="has no attribute 'Nope'"):
        import_class("topo.api.Spout.Nope")


def test_example_wordcount_validates() -> None:
    path = REPO / "configs" / "wordcount.yaml"
    if not path.exists():
        pytest.skip("configs/wordcount.yaml not written yet")
    assert load(path).name == "wordcount"


# --- the command line ----------------------------------------------------------------

def _topo(*args: str, cwd: Path = DATA) -> subprocess.CompletedProcess[str]:
    exe = [str(TOPO)] if TOPO.exists() else [sys.executable, "-m", "topo.cli"]
    return subprocess.run([*exe, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_cli_validate_ok() -> None:
    done = _topo("validate", "good.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("good.yaml: topology 'wordcount' is valid: 4 components "
                                   "(1 spout, 3 bolts), 7 tasks, 3 streams")


@pytest.mark.parametrize("name", ["cycle.yaml", "syntax.yaml", "missing_module.yaml"])
def test_cli_validate_bad_exits_2_with_one_line(name: str) -> None:
    line, key, rest = EXPECTED[name]
    done = _topo("validate", f"bad/{name}")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == f"bad/{name}:{line}: {key}: {rest}\n"


def test_cli_bad_override_exits_2() -> None:
    done = _topo("validate", "good.yaml", "--config", "queue.high_mark=lots")
    assert done.returncode == 2
    assert done.stderr == ("--config: queue.high_mark: expected a size such as 50MB, 500KB or a number of "
                           "bytes (got 'lots')\n")
