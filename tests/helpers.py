"""Small helpers shared by the tests that start processes: Ray actors, network namespaces."""

import subprocess
import time


def wait_until(condition, seconds: float = 20.0) -> bool:
    """Poll `condition` every 0.2 s until it holds or `seconds` pass; its last answer."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def resources_back(ray, before: dict) -> bool:
    """Every CPU is free again and no placement group is left beyond those held before (a shared fixture's)."""
    now = ray.available_resources()
    bundles = lambda res: {k for k in res if k.startswith("bundle_group")}  # noqa: E731
    return now.get("CPU", 0) >= before.get("CPU", 0) and bundles(now) <= bundles(before)


# -- the tiny sweep the pipeline, runner and store tests share ------------------------------------------------

SIMULATE_TOML = """
[simulate]
forward_s = 0.002
backward_s = 0.004
optimizer_s = 0.001
"""
LAN = '{ bandwidth = "1Gbit", latency = "50us" }'


def tiny_sweep_toml(strategies: list[str], name: str = "tiny", workers: int = 2, servers: int = 1,
                    link: str | None = LAN, grid: str = "") -> str:
    """A sweep file's text: the tiny model (16x16, batch 8, 3 steps with 1 warm-up) for each of `strategies` on
    `workers` workers, parameter servers with `servers` servers, over the emulated `link` (None: no link);
    `grid`: more grid lines (TOML), e.g. 'p2p = ["gloo", "sockets"]'."""
    quoted = ", ".join(f'"{s}"' for s in strategies)
    return f"""
name = "{name}"
[defaults]
workload = "tiny"
image_size = 16
batch_size = 8
steps = 3
warmup_steps = 1
{f"link = {link}" if link else ""}
[grid]
strategy = [{quoted}]
workers = [{workers}]
{grid}
[strategy_params.parameter_server]
servers = {servers}
"""


def netns_left_behind(name: str) -> list[str]:
    """The namespaces and links of the kernel-shaped network `name` that are still there (sbc-<name>-*, sb-<name>*)."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [line for line in (namespaces + links).splitlines() if f"sbc-{name}-" in line or f"sb-{name}" in line]
