"""Cluster state root can trust (issue 27): what `syncbench cluster up/status/down` read and act on.

A crafted state file cannot make `down` touch what syncbench did not make; a state directory of another user
(or writable by others) is refused before anything is written through it; a corrupt, list-shaped or incomplete
state file is one line naming it and the command that recovers, and never hides the other clusters. Tests that
make namespaces, bridges or veths need root and iproute2 (marker `netns`); they remove everything they make.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from experiments.cluster import netns, placement
from strategies.transport.link import Link, Network

REPO = Path(__file__).resolve().parents[2]
NETNS_PROBLEM = netns.support_problem()
needs_netns = pytest.mark.skipif(NETNS_PROBLEM is not None, reason=f"no namespaces here: {NETNS_PROBLEM}")
needs_ip = pytest.mark.skipif(shutil.which("ip") is None, reason="the `ip` command (iproute2) is not installed")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="making a directory of another user needs root")
TAG = f"{os.getpid() % 100000}"


@pytest.fixture
def state_root(monkeypatch):
    """A fresh, short (Ray's socket paths must fit in 107 bytes) state directory of this user, mode 0700."""
    root = tempfile.mkdtemp(prefix="sb", dir="/tmp")
    monkeypatch.setenv(netns.STATE_ENV, root)
    try:
        yield Path(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _syncbench(*args: str, root: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, **({netns.STATE_ENV: str(root)} if root else {})}
    return subprocess.run([sys.executable, "-m", "experiments", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env)


def _cli(capsys, *args: str, root: Path | None = None) -> subprocess.CompletedProcess:
    """The command line in this process (experiments.cli.main; a process of its own costs seconds of imports):
    its exit status and output, with SYNCBENCH_CLUSTER_DIR = `root` if given."""
    from experiments.cli.main import main

    saved = os.environ.get(netns.STATE_ENV)
    if root:
        os.environ[netns.STATE_ENV] = str(root)
    capsys.readouterr()
    try:
        code = main(list(args))
    finally:
        if saved is None:
            os.environ.pop(netns.STATE_ENV, None)
        else:
            os.environ[netns.STATE_ENV] = saved
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["syncbench", *args], code, out, err)


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=60)


def _link_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


@needs_netns
@pytest.mark.netns
def test_a_crafted_state_file_leaves_an_unrelated_namespace_bridge_process_and_directory_alone(state_root, tmp_path):
    """The attack of issue 27: a state file naming someone else's namespace, bridge, veth, processes and a
    directory (and temp dirs of "" and "/"). `down` refuses it, or, for a file shaped like syncbench's own,
    acts only on syncbench's names and on recorded processes that still are the cluster's."""
    ns, bridge, veth = f"ut{TAG}", f"ut{TAG}br", f"ut{TAG}v"
    victim_dir = tmp_path / "precious"
    victim_dir.mkdir()
    (victim_dir / "data").write_text("keep me")
    procs = []
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        # one process inside the unrelated namespace, one whose command line names the unrelated directory
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "600"]))
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(victim_dir)]))
        for _ in range(200):  # `ip netns exec` replaces itself with sleep: record the process once it has
            if (netns._identity(procs[0].pid) or (0, ""))[1] == "sleep":
                break
            time.sleep(0.05)
        recorded = [[p.pid, *netns._identity(p.pid)] for p in procs]

        real = netns.plan("ev", [Link(125e6)] * 2)  # a well-formed file to craft from (makes only its temp dir)
        honest = json.loads(json.dumps(dataclasses.asdict(real)))
        hostile = []
        for change in ({"head": {**honest["head"], "namespace": ns}}, {"bridge": bridge},
                       {"nodes": [{**honest["nodes"][0], "veth_bridge": veth}, honest["nodes"][1]]},
                       {"temp_dir": str(victim_dir)}, {"temp_dir": ""}, {"temp_dir": "/"},
                       {"token_path": str(victim_dir / "data")}):
            hostile.append({**honest, **change, "ray_pids": {"head": recorded}})
        for data in hostile:
            (state_root / "ev.json").write_text(json.dumps(data))
            with pytest.raises(netns.StateError) as refused:
                netns.down("ev", log=lambda *_: None)
            assert str(state_root / "ev.json") in str(refused.value) and "\n" not in str(refused.value)
        done = _syncbench("cluster", "down", "--name", "ev", root=state_root)  # the command line, as a user runs it
        assert done.returncode == 2
        assert f"{state_root}/ev.json" in _one_line(done.stderr) and "rm " in done.stderr

        # shaped exactly like syncbench's, but the recorded pids are someone else's: they are not in the
        # cluster's namespaces and do not name its temp dir, so `down` leaves them running
        (state_root / "ev.json").write_text(json.dumps({**honest, "ray_pids": {"head": recorded, "n0": recorded}}))
        assert netns.down("ev", log=lambda *_: None)
        assert not Path(real.temp_dir).exists() and not (state_root / "ev.json").exists()

        assert ns in _ip("netns", "list").stdout.split()
        assert _link_exists(bridge) and _link_exists(veth) and _link_exists(f"{veth}p")
        assert all(p.poll() is None for p in procs), "down killed a process that is not the cluster's"
        assert (victim_dir / "data").read_text() == "keep me"
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for name in (veth, bridge):
            _ip("link", "del", name, check=False)
        _ip("netns", "del", ns, check=False)


@needs_root
def test_a_foreign_owned_state_directory_with_a_symlinked_tmp_is_refused_and_the_target_untouched(tmp_path,
                                                                                                   state_root, capsys):
    """Another user's directory (mode 0777 or 0755) with NAME.tmp and NAME.json symlinked to a root-owned file:
    `up`, `status` and `down` refuse it in one line before writing, reading or creating anything."""
    target = tmp_path / "root-owned"
    target.write_text("precious\n")
    name = f"f{TAG}"
    for mode in (0o777, 0o755):
        foreign = Path(tempfile.mkdtemp(prefix="sb", dir="/tmp"))
        try:
            (foreign / f"{name}.tmp").symlink_to(target)
            (foreign / f"{name}.json").symlink_to(target)
            os.chown(foreign, 65534, 65534)
            os.chmod(foreign, mode)
            up = _cli(capsys, "cluster", "up", "--nodes", "1", "--bandwidth", "1Gbit", "--name", name,
                      "--state-dir", str(foreign))
            assert up.returncode == 2
            line = _one_line(up.stderr)
            assert f"cluster state directory {foreign}" in line and "owned by uid 65534" in line, line
            for action in ("status", "down"):
                done = _cli(capsys, "cluster", action, "--name", name, root=foreign)
                assert done.returncode == 2 and "owned by uid 65534" in _one_line(done.stderr)
            assert target.read_text() == "precious\n" and os.stat(target).st_uid == 0
            assert sorted(p.name for p in foreign.iterdir()) == [f"{name}.json", f"{name}.tmp"]
            assert f"sbc-{name}-" not in _ip("netns", "list", check=False).stdout
        finally:
            shutil.rmtree(foreign, ignore_errors=True)
            if shutil.which("ip"):
                netns.down(name, log=lambda *_: None)  # by name prefix: whatever a wrongly accepted `up` made


def test_a_state_directory_others_can_write_or_a_symlinked_state_file_is_refused(state_root, tmp_path):
    """Our own directory but mode 0777: refused; in a good directory a symlinked NAME.json is not read and a
    planted NAME.tmp symlink is never written through (state files get fresh O_EXCL|O_NOFOLLOW names)."""
    target = tmp_path / "target"
    target.write_text("precious\n")
    os.chmod(state_root, 0o777)
    with pytest.raises(netns.StateError, match=r"mode 0777: other users can write to it.*--state-dir"):
        netns.Cluster.load("ab")
    found, problems = netns.scan()  # what status, sweeps and `run --address` see: no cluster, one line why
    assert found == [] and len(problems) == 1 and f"cluster state directory {state_root}" in problems[0]
    os.chmod(state_root, 0o700)
    (state_root / "ab.json").symlink_to(target)
    with pytest.raises(netns.StateError, match=r"ab\.json: it is a symbolic link.*`rm "):
        netns.Cluster.load("ab")
    (state_root / "ab.json").unlink()
    (state_root / "ab.tmp").symlink_to(target)
    netns._write_state("ab", "{}\n")
    assert target.read_text() == "precious\n" and (state_root / "ab.json").read_text() == "{}\n"
    assert not list(state_root.glob(".ab.*.tmp"))  # nothing left behind


@needs_ip
def test_corrupt_and_list_shaped_state_files_are_one_line_each_and_other_clusters_unaffected(state_root,
                                                                                              monkeypatch, capsys):
    """Corrupt JSON, a list, an object without "head", JSON nested 100,000 deep and a FIFO: each is one line
    naming its file and the command that recovers; the good cluster beside them is found by status, by kernel
    sweeps and by `run --address`, and a new cluster's plan avoids its subnet."""
    good = netns.plan("ok", [Link(125e6)] * 2)
    try:
        good.save()
        bad = {"broken": "{\"name\": \"broken\", \"head\" {", "listy": "[1, 2, 3]",
               "nohead": json.dumps({"name": "nohead", "nodes": []}), "deep": "[" * 100_000 + "]" * 100_000}
        for name, text in bad.items():
            (state_root / f"{name}.json").write_text(text)
        os.mkfifo(state_root / "fifo.json")  # opened non-blocking: never a hang
        found, problems = netns.scan()
        assert [c.name for c in found] == ["ok"] and found[0] == good
        assert len(problems) == len(bad) + 1
        for name in [*bad, "fifo"]:
            line = next(p for p in problems if f"{state_root}/{name}.json:" in p)
            assert "\n" not in line and f"`rm {state_root}/{name}.json`" in line
            assert f"cluster down --name {name}`" in line
        assert "found a JSON list" in next(p for p in problems if "listy" in p)
        assert "missing " in next(p for p in problems if "nohead" in p)
        assert "nested too deeply" in next(p for p in problems if "deep" in p)

        assert netns.Cluster.load("ok") == good and netns.find() == good
        assert netns.find(address=good.address) == good
        monkeypatch.setattr(netns, "support_problem", lambda: None)
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        kernel = Network(Link(125e6), emulation="kernel")
        monkeypatch.setattr(placement, "use_token", lambda cluster: None)  # no Ray import for this check
        assert placement.connect_address([kernel], None) == good.address
        assert placement.connect_address([None], "127.0.0.1:6379") == "127.0.0.1:6379"  # `run --address`
        other = netns.plan("new", [Link(125e6)])
        try:
            assert other.subnet != good.subnet
        finally:
            shutil.rmtree(other.temp_dir)

        for action in ("status", "down"):
            done = _cli(capsys, "cluster", action, "--name", "listy", root=state_root)
            assert done.returncode == 2, done
            line = _one_line(done.stderr)
            assert f"{state_root}/listy.json: expected a JSON object, found a JSON list" in line
        assert (state_root / "listy.json").exists()  # refused, not removed
        (state_root / "ok.json").unlink()
        with pytest.raises(ValueError, match=r"clusters up: none.*Not read: cluster state file .*broken\.json"):
            placement.connect_address([kernel], None)
    finally:
        shutil.rmtree(good.temp_dir, ignore_errors=True)


@needs_netns
@pytest.mark.netns
def test_a_failed_up_removes_only_what_it_made_never_a_bridge_that_was_there(state_root):
    """A bridge named like the cluster's existed before: `up` refuses and leaves it; a failure halfway through
    the network removes the namespaces and links that call made, its temp dir and its state file."""
    name = f"u{TAG}"
    try:
        _ip("link", "add", f"sb-{name}", "type", "bridge")
        with pytest.raises(netns.ClusterError, match=rf"sb-{name} exist.*cluster down --name {name}"):
            netns.up(name, [Link(125e6)])
        assert _link_exists(f"sb-{name}") and not netns.Cluster.load(name)
        assert not list(state_root.iterdir())
    finally:
        _ip("link", "del", f"sb-{name}", check=False)
        netns.down(name, log=lambda *_: None)  # whatever a wrongly accepted `up` made (after the bridge: not it)

    cluster = netns.plan(name, [Link(125e6)] * 2)
    made: list = []
    blocker = cluster.nodes[1].namespace  # made by "someone else" between the check and the creation
    try:
        _ip("netns", "add", blocker)
        with pytest.raises(netns.ClusterError, match=rf"netns add {blocker}"):
            netns._make_network(cluster, made)
        assert ("netns", cluster.head.namespace) in made and ("netns", blocker) not in made
        netns._undo(cluster, made)
        assert blocker in _ip("netns", "list").stdout.split()  # not made by this call: left alone
        assert cluster.head.namespace not in _ip("netns", "list").stdout.split()
        assert not _link_exists(cluster.bridge) and not _link_exists(cluster.head.veth_bridge)
        assert not Path(cluster.temp_dir).exists()
    finally:
        _ip("netns", "del", blocker, check=False)
        netns._undo(cluster, made)
