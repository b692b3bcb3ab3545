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
    "parallelism_zero.yaml": (7, "bolts[0].parallelism", "must be an integer from 1 to 1024 (got 0)"),
    "parallelism_string.yaml": (5, "spouts[0].parallelism", "must be an integer from 1 to 1024 (got 'two')"),
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
        "two.yaml:3: spouts[0].parallelism: must be an integer from 1 to 1024 (got -1)",
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


# --- settings and topologies that would take the machine (issue 9, item 7) -------------

_TWO = """\
name: t
config:
  {config}
spouts:
  - {{id: s, class: spec_components.Sentences, parallelism: {par}}}
bolts:
  - {{id: b, class: spec_components.Split}}
streams:
  - {{from: s, to: b, grouping: {{type: shuffle}}}}
"""


def test_a_batch_size_that_would_take_the_machine_is_refused_with_its_range() -> None:
    with pytest.raises(SpecError) as info:
        loads(_TWO.format(config="batch.size: 100000000", par=1), "t.yaml")
    assert str(info.value) == "t.yaml:3: config.batch.size: must be between 1 and 65536 (got 100000000)"


def test_a_parallelism_that_would_take_the_machine_is_refused_with_its_range() -> None:
    with pytest.raises(SpecError) as info:
        loads(_TWO.format(config="acking: true", par=100000000), "t.yaml")
    assert str(info.value) == "t.yaml:5: spouts[0].parallelism: must be an integer from 1 to 1024 (got 100000000)"


def test_the_builder_refuses_a_huge_parallelism_too() -> None:
    from topo.topology import TopologyBuilder, TopologyError
    from spec_components import Sentences

    b = TopologyBuilder("t")
    b.spout("s", Sentences(), parallelism=100_000_000)
    with pytest.raises(TopologyError, match=r"component 's': parallelism must be at most 1024, got 100000000"):
        b.build()


def test_the_same_stream_declared_twice_is_refused() -> None:
    text = _TWO.format(config="acking: true", par=1) + "  - {from: s, to: b, grouping: {type: all}}\n"
    with pytest.raises(SpecError) as info:
        loads(text, "t.yaml")
    assert str(info.value) == ("t.yaml:10: streams[1]: bolt 'b' subscribes to stream 'default' of 's' twice "
                               "(each tuple would be delivered twice) (got 's -> b')")


def test_the_builder_refuses_the_same_stream_twice() -> None:
    from topo.topology import TopologyBuilder, TopologyError
    from spec_components import Sentences, Split

    b = TopologyBuilder("t")
    b.spout("s", Sentences())
    b.bolt("b", Split()).shuffle("s").shuffle("s")
    with pytest.raises(TopologyError, match="subscribes to stream 'default' of 's' twice"):
        b.build()


def test_sink_fields_missing_from_its_input_stream_are_caught_at_validation(tmp_path: Path) -> None:
    text = f"""\
name: t
spouts:
  - {{id: s, class: spec_components.Sentences}}
bolts:
  - {{id: split, class: spec_components.Split}}
  - {{id: count, class: spec_components.Count}}
  - id: sink
    class: topo.sinks.SQLiteSink
    kwargs: {{path: {tmp_path / 'x.db'}, table: t, fields: [word, cnt], key_fields: [word]}}
streams:
  - {{from: s, to: split, grouping: {{type: shuffle}}}}
  - {{from: split, to: count, grouping: {{type: fields, fields: [word]}}}}
  - {{from: count, to: sink, grouping: {{type: shuffle}}}}
"""
    with pytest.raises(SpecError) as info:
        loads(text, "t.yaml")
    assert str(info.value) == ("t.yaml:9: bolts[2].kwargs: bolt 'sink' reads fields ['cnt'] that stream "
                               "'default' of 'count' does not declare (declared: ['word', 'count'])")


# --- hostile YAML is bounded (issue 9, item 8) -------------------------------------------

def _bomb(levels: int, width: int = 9) -> str:
    lines = ["a0: &a0 [lol]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines)


def test_an_alias_bomb_is_refused_before_it_is_expanded() -> None:
    # 10 ** 6 leaves: small enough that the unbounded loader survives it (and reports
    # something else), big enough to be over the limit.
    text = "x: " + _bomb(6, 10).replace("\n", "\n  ").replace("a0: ", "\n  a0: ", 1) + """
name: t
spouts:
  - {id: s, class: spec_components.Sentences, kwargs: {text: *a6}}
"""
    with pytest.raises(SpecError) as info:
        loads(text, "bomb.yaml")
    assert str(info.value).startswith("bomb.yaml:")
    assert "aliases expand to more than 100000 values" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_billion_laughs_file_is_refused_in_bounded_memory_and_time(tmp_path: Path) -> None:
    """9 ** 9 values in kwargs and in config: refused quickly under a 1 GB address-space limit."""
    bomb = "\n".join("  " + line for line in _bomb(9).splitlines())
    (tmp_path / "bomb.yaml").write_text(f"""\
name: t
anchors:
{bomb}
config: {{seed: *a9}}
spouts:
  - {{id: s, class: spec_components.Sentences, kwargs: {{text: *a9}}}}
""")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
            "from topo.cli import main; sys.exit(main(['validate', 'bomb.yaml']))")
    env = {"PYTHONPATH": f"{DATA}:{REPO}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "aliases expand to more than 100000 values" in done.stderr


def test_a_file_over_the_size_limit_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    from topo.spec import MAX_FILE_BYTES

    path = tmp_path / "comments.yaml"
    path.write_text("# a comment line of sixty-four characters, padded out to length.\n" * 40_000)
    size = path.stat().st_size
    assert size > MAX_FILE_BYTES == 1_000_000
    with pytest.raises(SpecError) as info:
        load(path)
    assert str(info.value) == f"{path}: file: over the 1 MB limit for a topology file (got {size} bytes)"


def test_deep_nesting_is_one_line() -> None:
    with pytest.raises(SpecError) as info:
        loads("name: t\nspouts: " + "[" * 5000 + "]" * 5000 + "\n", "deep.yaml")
    assert str(info.value).startswith("deep.yaml:2: ") and "nested deeper than" in str(info.value)


def test_values_are_shortened_before_they_are_formatted() -> None:
    from topo.config import ConfigError, short_repr
    from topo.spec import Problem

    class NoRepr:
        def __repr__(self) -> str:
            raise AssertionError("the full repr was built")

    huge = [1] * 1_000_000 + [NoRepr()]
    assert short_repr(huge) == "[" + ", ".join(["1"] * 25) + ", 1..."
    assert len(str(ConfigError("seed", huge, "expected an integer"))) < 200
    assert str(Problem("t.yaml", 3, "config.seed", "expected an integer", {"k": huge})).endswith(", 1...)")
    assert short_repr("x" * 10**7) == "'" + "x" * 76 + "..."
    assert short_repr(10 ** 5000) == "<an integer of 16610 bits>"
    for small in ({'id': 'sentences', 'n': [1, 2.5, None, True]}, (1,), [], {}, "it's", set(), {3}):
        assert short_repr(small) == repr(small)
