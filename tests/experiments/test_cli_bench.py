"""`syncbench bench` as subcommands (collectives, ps, transport, harness, overlap): the old flags (`bench --ps`,
--transport, --harness, --overlap) reach the same benchmark with the same arguments and print a one-line notice
naming the new form; a flag of another benchmark is refused. No Ray: the benchmarks are replaced by recorders."""

from __future__ import annotations

import pytest

from experiments.cli import bench as bench_cli
from experiments.cli.main import main


@pytest.mark.parametrize(("argv", "expected", "notice"), [
    (["bench"], ["bench", "collectives"], None),
    (["bench", "--workers", "2", "--sizes", "4K"], ["bench", "collectives", "--workers", "2", "--sizes", "4K"], None),
    (["bench", "--ps", "--workers", "2"], ["bench", "ps", "--workers", "2"], "--ps"),
    (["bench", "--workers", "2", "--overlap"], ["bench", "overlap", "--workers", "2"], "--overlap"),
    (["bench", "--transport"], ["bench", "transport"], "--transport"),
    (["bench", "--harness", "--device", "cpu"], ["bench", "harness", "--device", "cpu"], "--harness"),
    (["bench", "--ps", "--overlap"], ["bench", "ps", "--overlap"], "--ps"),  # the second: refused by `ps`
    (["bench", "ps", "--workers", "2"], ["bench", "ps", "--workers", "2"], None),  # the new form as it is
    (["bench", "-h"], ["bench", "-h"], None),
    (["model", "--overlap"], ["model", "--overlap"], None),  # another command's flag of the same name
], ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_the_old_form_is_read_as_the_subcommand(argv, expected, notice):
    new, said = bench_cli.upgrade(argv)
    assert new == expected
    if notice is None:
        assert said is None
    else:
        mode = bench_cli.OLD_FLAGS[notice]
        assert said == f"# note: `syncbench bench {notice}` is now `syncbench bench {mode}` (the old flag still works)"


@pytest.fixture
def recorded(monkeypatch):
    """Every benchmark replaced by a recorder of its keyword arguments: {function name: kwargs}."""
    from experiments.bench import collectives, overlap, parameter_server, transport
    from experiments.cluster import ray_runtime

    calls = {}

    def recorder(name, result=None):
        def record(*args, **kwargs):
            calls[name] = {**kwargs, **dict(enumerate(args))}
            return result
        return record

    monkeypatch.setattr(collectives, "bench", recorder("bench"))
    for module, name in ((parameter_server, "ps_bench"), (parameter_server, "straggler_bench"),
                         (transport, "transport_bench"), (transport, "harness_bench"),
                         (overlap, "overlap_bench")):
        monkeypatch.setattr(module, name, recorder(name, []))
    for module, name in ((parameter_server, "format_table"), (parameter_server, "format_straggler"),
                         (transport, "format_table"), (transport, "format_harness"), (overlap, "format_overlap")):
        monkeypatch.setattr(module, name, lambda rows, name=name: f"{name} table")
    monkeypatch.setattr(ray_runtime, "ensure_ray", recorder("ensure_ray"))
    return calls


@pytest.mark.parametrize(("old", "new"), [
    (["bench", "--workers", "2", "--sizes", "4K,64K", "--strategies", "ring", "--bandwidth", "1Gbit", "--latency",
      "50us", "--iters", "2", "--p2p", "sockets"],
     ["bench", "collectives", "--workers", "2", "--sizes", "4K,64K", "--strategies", "ring", "--bandwidth", "1Gbit",
      "--latency", "50us", "--iters", "2", "--p2p", "sockets"]),
    (["bench", "--ps", "--workers", "3", "--partition-mb", "2", "--steps", "3", "--bandwidth", "10Gbit"],
     ["bench", "ps", "--workers", "3", "--partition-mb", "2", "--steps", "3", "--bandwidth", "10Gbit"]),
    (["bench", "--ps"], ["bench", "ps", "--bandwidth", "1Gbit", "--latency", "50us"]),  # the PS bench's link
    (["bench", "--transport", "--address", "auto"], ["bench", "transport", "--address", "auto"]),
    (["bench", "--harness", "--workload", "tiny", "--batch-size", "4", "--image-size", "8"],
     ["bench", "harness", "--workload", "tiny", "--batch-size", "4", "--image-size", "8"]),
    (["bench", "--overlap", "--models", "tiny", "--links", "none", "--strategies", "ring,ddp", "--steps", "2"],
     ["bench", "overlap", "--models", "tiny", "--links", "none", "--strategies", "ring,ddp", "--steps", "2"]),
], ids=lambda argv: " ".join(argv[:3]))
def test_the_old_flag_and_the_subcommand_run_the_same_benchmark_and_only_the_old_one_says_so(capsys, recorded,
                                                                                             old, new):
    assert main(new) == 0
    new_out, new_err = capsys.readouterr()
    by_new = dict(recorded)
    recorded.clear()
    assert main(old) == 0
    old_out, old_err = capsys.readouterr()
    assert by_new and recorded == by_new  # the same functions, the same arguments
    assert "note:" not in new_out and not new_err and not old_err
    if old[1] == "--workers":  # the default benchmark: bench with no subcommand is collectives, no notice
        assert old_out == new_out
    else:
        notice, rest = old_out.split("\n", 1)
        assert notice == f"# note: `syncbench bench {old[1]}` is now `syncbench bench {new[1]}` (the old flag " \
                         f"still works)"
        assert rest == new_out


def test_the_collectives_arguments_reach_the_benchmark(recorded, capsys):
    assert main(["bench", "collectives", "--workers", "2", "--sizes", "4K,1M", "--strategies", "ring, native",
                 "--bandwidth", "1Gbit", "--ranks-per-node", "2", "--intra-bandwidth", "100Gbit"]) == 0
    call = recorded["bench"]
    assert call["workers"] == 2 and call["sizes"] == [4096, 1 << 20] and call["names"] == ["ring", "native"]
    assert call["link"] == {"bandwidth": "1Gbit", "latency": "0s", "emulation": "python",
                            "intra_bandwidth": "100Gbit"}
    assert call["ranks_per_node"] == 2


@pytest.mark.parametrize(("argv", "named"), [
    (["bench", "ps", "--sizes", "4K"], "--sizes"),  # another benchmark's flag: refused, not ignored
    (["bench", "--ps", "--sizes", "4K"], "--sizes"),
    (["bench", "--ps", "--overlap"], "--overlap"),  # two old flags: one benchmark at a time
    (["bench", "transport", "--workers", "2"], "--workers"),
    (["bench", "harness", "--p2p", "sockets"], "--p2p"),
    (["bench", "pigeon"], "pigeon"),
])
def test_a_flag_the_benchmark_does_not_take_is_a_usage_error(capsys, argv, named):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    out, err = capsys.readouterr()
    assert named in err and "usage: syncbench" in err
    assert "note:" not in out  # a refused command line says nothing about its form


def test_bench_help_lists_the_five_benchmarks(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["bench", "-h"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert all(f"    {mode}" in out for mode in ("collectives", "ps", "transport", "harness", "overlap")), out
